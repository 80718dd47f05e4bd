"""Replay the course's training step on a modelled cluster.

    python -m course_lib.simulate --strategy ddp --world 64 --profile h100_node [--bucket-mb 25] [--json]
                                  [--trace OUT.json] [--recording REC.json]
    python -m course_lib.simulate --model gpt2 --world 64 --profile h100_node

--strategy ddp: records a BucketedDDP step of course_lib.models.Net on 2 gloo ranks (a few seconds), or
loads --recording if that file exists (and saves a new recording there otherwise), then replays it on
--world devices. fsdp: lecture 10's FSDP2 step of an MLP on 2 gloo ranks, the same way. single: one
process, no communication (--world must be 1). --model gpt2 (instead of the course's own step): GPT-2
small recorded by shape (no arithmetic), with ddp (the replay adds DDP's all-reduces) or single.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from .profiles import PROFILES, get_profile
from .record import Recording, record_ddp, record_fsdp, record_single
from .replay import ALGORITHMS, replay
from .shapes import GPT2_SMALL, record_by_shape

STRATEGIES = ("ddp", "fsdp", "single")
MODELS = ("course", "gpt2")     # course: the course's own step (Net; fsdp: lecture 10's MLP), recorded on 2 ranks


def check_strategy(strategy: str, world: int, model: str = "course") -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES} (gpt2 is a model: --model gpt2; pipelines: "
                         f"course_lib.simulate.pipeline); got {strategy!r}")
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}; got {model!r}")
    if strategy == "single" and world != 1:
        raise ValueError(f"strategy 'single' runs on one device: world must be 1; got {world}")
    if model == "gpt2" and strategy == "fsdp":
        raise ValueError("model 'gpt2' is recorded by shape on one device: strategy must be 'ddp' (the replay "
                         "adds DDP's all-reduces) or 'single'; got 'fsdp'")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m course_lib.simulate", description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="ddp", help=f"one of {STRATEGIES}")
    parser.add_argument("--model", default="course", help=f"one of {MODELS}: the course's own step, or GPT-2 "
                                                         "small recorded by shape (ddp or single)")
    parser.add_argument("--world", type=int, default=8, help="devices to replay on")
    parser.add_argument("--profile", default="h100_node", help=f"one of {tuple(PROFILES)}")
    parser.add_argument("--bucket-mb", type=float, default=None, help="re-bucket the gradients (MB per bucket)")
    parser.add_argument("--algorithm", default="auto", help=f"one of {ALGORITHMS} (network.py)")
    parser.add_argument("--batch", type=int, default=64, help="batch per rank of the recorded step (--model gpt2: 8)")
    parser.add_argument("--recording", type=Path, default=None, help="JSON recording to load or save")
    parser.add_argument("--json", action="store_true", help="print the prediction as JSON")
    parser.add_argument("--trace", type=Path, default=None, help="write the predicted timeline as a Chrome trace")
    args = parser.parse_args(argv)
    if args.profile not in PROFILES:
        parser.error(f"--profile must be one of {tuple(PROFILES)}; got {args.profile!r}")
    try:
        check_strategy(args.strategy, args.world, args.model)
    except ValueError as e:
        parser.error(str(e))
    if args.recording is not None and args.recording.exists():
        rec = Recording.load(args.recording)
    elif args.model == "gpt2":
        rec = record_by_shape(GPT2_SMALL, batch=8)
    else:
        rec = {"ddp": lambda: record_ddp(2, batch=args.batch), "fsdp": lambda: record_fsdp(2, batch=args.batch),
               "single": lambda: record_single(batch=args.batch)}[args.strategy]()
        if args.recording is not None:
            rec.save(args.recording)
    pred = replay(rec, get_profile(args.profile), world=args.world, bucket_mb=args.bucket_mb,
                  algorithm=args.algorithm)
    out = {"recording": rec.label, "profile": args.profile, **pred.summary()}
    if args.trace is not None:
        pred.timeline.save_chrome(args.trace)
        out["trace"] = str(args.trace)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{pred.timeline.label}")
        print(f"step {out['step_ms']:.3f} ms = compute {out['compute_ms']:.3f} ms + exposed communication "
              f"{out['exposed_comm_ms']:.3f} ms (collectives {out['comm_ms']:.3f} ms, {out['collectives']} per step); "
              f"MFU {100 * out['mfu']:.3g}%")
        if args.trace is not None:
            print(f"trace: {args.trace} (open it in https://ui.perfetto.dev)")
    return out


if __name__ == "__main__":
    main()
