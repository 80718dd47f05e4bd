"""Kill a rank on purpose, to watch a job survive it: the train CLI with a fault injected.

    torchrun --standalone --nproc_per_node 2 --max-restarts 1 -m course_lib.distributed.faults \
        --fail-at-step 5 --fail-rank 1 --strategy ddp --checkpoint-dir runs/a --checkpoint-every 3 --resume

Every argument but the two --fail-* ones goes to `python -m course_lib.train`. Rank R leaves with
os._exit(1), as a crashed process would (no cleanup, no exception), right after global step N and
the checkpoint due at it, but only in torchrun's first attempt (TORCHELASTIC_RESTART_COUNT unset or
0): the restarted group resumes from the last checkpoint and finishes. Lecture 08 and the restart
tests use it; the training step itself carries no test hook.
"""
from __future__ import annotations

import argparse
import os
import sys


def die_at(step: int, rank: int):
    """A `train.run(on_step_end=...)` callback: this process exits after global `step` if it is `rank`."""
    from ..env import dist_info

    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") in ("", "0")
    me = dist_info().rank

    def on_step_end(global_step: int) -> None:
        if first_attempt and global_step == step and me == rank:
            print(f"faults: rank {rank} exits at step {step}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(1)

    return on_step_end


def main(argv=None) -> None:
    from .. import train

    p = argparse.ArgumentParser(prog="python -m course_lib.distributed.faults", description=__doc__.split("\n\n")[0],
                                epilog="All other arguments go to python -m course_lib.train.")
    p.add_argument("--fail-at-step", type=int, required=True, help="the global step after which the rank dies")
    p.add_argument("--fail-rank", type=int, default=0, help="which rank dies")
    args, rest = p.parse_known_args(argv)
    if args.fail_at_step < 1 or args.fail_rank < 0:
        p.error(f"--fail-at-step must be >= 1 and --fail-rank >= 0; got {args.fail_at_step}, {args.fail_rank}")
    train.cli(rest, on_step_end=die_at(args.fail_at_step, args.fail_rank))


if __name__ == "__main__":
    main()
