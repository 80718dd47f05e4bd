"""The course's training script: one command for plain python, torchrun (one or many nodes) and SLURM.

    python -m course_lib.train                                  # Net on MNIST, defaults below
    python -m course_lib.train --model lenet300 --epochs 3 --json
    python -m course_lib.train --precision bf16 --json          # bf16 autocast; 16 = fp16 + GradScaler (CUDA)
    python -m course_lib.train --device cuda --batch-size 512 --lr 0.02   # fastest on a GPU (bench gpu-fast)
    python -m course_lib.train --device cuda --batch-size 512 --lr 0.02 --compile-mode reduce-overhead  # CUDA graphs
    python -m course_lib.train --checkpoint-dir runs/a --resume   # continue after a crash
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 -m course_lib.train --strategy ddp --json
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 4 -m course_lib.train --model vit --strategy fsdp_tp --tp 2
    torchrun --nnodes 2 --node_rank 0 --rdzv-backend c10d --rdzv-endpoint HOST:PORT --nproc_per_node 4 \
        -m course_lib.train --strategy ddp --checkpoint-dir runs/b --checkpoint-every 50 --resume

A thin script over the training loop (`course_lib.loop.fit`): the launch is behind one seam,
`course_lib.strategy` (single | ddp | fsdp | fsdp_tp: how to join the ranks, wrap the model, and get and load
state dicts), and checkpoints behind one component, `course_lib.checkpoint.Checkpointer`. It reads
RANK/WORLD_SIZE/LOCAL_RANK (set by torchrun) and logs from rank 0 only. With --json the last
stdout line is a JSON object (test_accuracy, train_seconds, images_per_second, world_size,
device, mfu, ...); under DDP images_per_second is the sum over ranks and --batch-size is per rank.

MFU (model FLOPs utilisation, `course_lib.flops`): model_flops_per_image is the forward + backward
FLOPs of one training step per image, counted by torch's FlopCounterMode on one batch (matmuls and
convolutions only, 2 FLOPs per multiply-add; elementwise work, the loss and the optimizer are not
counted). achieved_flops = model_flops_per_image * images_per_second (the timed training epochs);
mfu = achieved_flops / peak_flops, the THEORETICAL peak (PaLM's definition) from `hardware.peak_flops`
(fp32, or the --precision dtype); peak_source says how: "theoretical: ..." (a GPU's datasheet, a CPU's
cores x SIMD lanes x FMA units x 2 x clock), or "measured: ... (no theoretical peak: why)" where none
can be derived. mfu_achievable = achieved_flops / achievable_flops, the best measured matmul on this
machine (`hardware.achievable_flops`, achievable_source). Under ddp/fsdp all are global: achieved and
peaks are sums over the ranks (each rank derives and measures the peak of its own device, or share
of the CPU).

--strategy ddp (under torchrun): gloo on CPU, nccl on cuda:LOCAL_RANK; torch's
DistributedDataParallel; each rank trains on its own shard of the data each epoch
(`rank_data.ShardedTensorLoader` with the strategy's rank and world size, DistributedSampler's
order; one process is world size 1); rank 0 downloads the data first, then the others load it;
rank 0 alone logs and writes checkpoints, behind a barrier.

--strategy fsdp (under torchrun): the same launch and data, but the model is sharded with FSDP2
(`distributed.sharding.shard_model`: rank 0's weights, then `fully_shard` per layer): each rank
keeps half (1/N) of the parameters, gradients and Adam state. Checkpoints hold FULL state dicts
gathered to rank 0 (`get_model_state_dict(..., full_state_dict=True, cpu_offload=True)`): the
model part loads into an unsharded model; --resume re-shards them (fsdp checkpoints resume with
fsdp only: their optimizer state is keyed by parameter name).

--strategy fsdp_tp --tp N (under torchrun, --model vit): 2-D, tensor parallel by heads inside each
ViT block over N ranks, FSDP2 over the world/N data-parallel ranks (`distributed.fsdp_tp`). The N
ranks of one tensor-parallel group load the same batch (the loader's rank and world size are the
strategy's data_rank and data_world_size); images_per_second and global_batch_size count each
batch once. Checkpoints as fsdp's: full state dicts.

--compile-mode (implies --compile) is torch.compile's `mode`: "reduce-overhead" adds CUDA graphs to
Inductor ("max-autotune" too, and tunes kernels). An eager step of a small model is host-bound (the host
issues each kernel slower than the GPU runs it: `simulate.profiles.gpu_host_seconds`); a graph replays
them with one launch. Captured: the model's forward and, through AOTAutograd, its backward (CUDAGraph
Trees: recorded on the second call per batch shape, replayed after). The loss, zero_grad, the optimizer
and the scheduler stay eager; a graph that mutates an input runs without CUDA graphs (TORCH_LOGS=perf_hints
lists skips; Net has no buffers). Sources: torch.compile's docstring (2.14.1) and the PyTorch docs'
CUDAGraph Trees page. Off CUDA both modes fall back to "default" with one note (`compile_mode_for`); the
summary's compile_mode is the mode used. Not yet measured on a GPU.

Fault tolerance: --checkpoint-every N writes DIR/last.pt atomically every N optimizer steps
(model, optimizer, scheduler, every rank's RNG, epoch, step); --resume continues from it, mid-
epoch, skipping the batches already done; under `torchrun --max-restarts K` a group that lost a
rank restarts and resumes from it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from torch import nn

from .checkpoint import Checkpointer
from .loop import OPTIMIZERS, evaluate, fit, make_optimizer, one_cycle
from .precision import PRECISIONS, check_precision, grad_scaler
from .strategy import STRATEGIES, setup_strategy

MEMORY_FORMATS = ("auto", "channels_last", "contiguous")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")    # torch.compile's; the last two record CUDA graphs


def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a {kind.__name__}; got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0; got {text!r}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    from .env import DEVICE_CHOICES
    from .models import MODELS

    p = argparse.ArgumentParser(prog="python -m course_lib.train", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="net")
    p.add_argument("--epochs", type=_positive(int), default=15)
    p.add_argument("--batch-size", type=_positive(int), default=64, help="per process")
    p.add_argument("--lr", type=_positive(float), default=5e-3, help="peak learning rate (one-cycle schedule)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adam")
    p.add_argument("--device", default="auto", help=f"one of {DEVICE_CHOICES} or cuda:N")
    p.add_argument("--data-dir", default=None, help="MNIST root (default: $COURSE_DATA_DIR, else ~/.cache/course_lib/data)")
    p.add_argument("--train-subset", type=_positive(int), default=None, help="use the first N training images")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=None, help="write DIR/last.pt atomically after every epoch")
    p.add_argument("--checkpoint-every", type=_positive(int), default=None, metavar="STEPS",
                   help="also write DIR/last.pt every STEPS optimizer steps (resume continues mid-epoch)")
    p.add_argument("--resume", action="store_true", help="continue from DIR/last.pt if it exists")
    p.add_argument("--strategy", choices=STRATEGIES, default="single",
                   help="ddp: DistributedDataParallel; fsdp: FSDP2, parameters/gradients/optimizer state sharded "
                        "over the ranks; fsdp_tp: tensor parallel over --tp ranks inside each block (--model vit), "
                        "FSDP2 over the rest; all one process per rank (launch with torchrun)")
    p.add_argument("--tp", type=_positive(int), default=None,
                   help="fsdp_tp only: ranks per tensor-parallel group, dividing the world size and the ViT's "
                        "heads (default 2)")
    p.add_argument("--precision", choices=PRECISIONS, default="32",
                   help="bf16: bfloat16 autocast (CPU or GPU); 16: fp16 autocast + GradScaler (CUDA only)")
    p.add_argument("--memory-format", choices=MEMORY_FORMATS, default="auto",
                   help="channels_last stores conv weights and activations as NHWC, which oneDNN (CPU) and cuDNN "
                        "run much faster for small convolutions; auto: channels_last for models with Conv2d "
                        "layers, except under a sharding strategy (fsdp, fsdp_tp: parameters sharded as rows)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model (Inductor: Triton kernels on CUDA, C++ on the CPU); the first "
                        "epoch's time includes compiling, once per batch shape")
    p.add_argument("--compile-mode", choices=COMPILE_MODES, default=None,
                   help="torch.compile's mode; implies --compile. reduce-overhead: CUDA graphs, the model's forward "
                        "and backward replayed without a host launch per kernel; max-autotune: CUDA graphs and "
                        "tuned kernels (long compile). Both need CUDA: elsewhere they fall back to default, with "
                        "a note. --compile alone: default")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def resolve_memory_format(name: str, model: nn.Module, shards_parameters: bool = False) -> torch.memory_format:
    """torch.channels_last or torch.contiguous_format for --memory-format `name` (see its help).

    shards_parameters: the strategy's (fsdp: each rank holds flat rows of every parameter), so auto
    keeps them contiguous.
    """
    if name not in MEMORY_FORMATS:
        raise ValueError(f"memory_format must be one of {MEMORY_FORMATS}; got {name!r}")
    if name == "auto":
        has_conv = any(isinstance(m, nn.Conv2d) for m in model.modules())
        name = "channels_last" if has_conv and not shards_parameters else "contiguous"
    return torch.channels_last if name == "channels_last" else torch.contiguous_format


def compile_mode_for(device, mode: str) -> tuple[str, str | None]:
    """(the torch.compile mode to use on `device`, a note saying why when it is not `mode`).

    reduce-overhead and max-autotune record CUDA graphs, which only CUDA has: on any other device both
    become "default" (on a CPU Inductor would skip the graphs anyway; max-autotune's kernel tuning would
    only lengthen a compile that already dwarfs a short run). device: a torch.device or its name.
    """
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile_mode must be one of {COMPILE_MODES}; got {mode!r}")
    device = torch.device(device)
    if mode == "default" or device.type == "cuda":
        return mode, None
    return "default", (f"--compile-mode {mode} records CUDA graphs, which need a CUDA device; on {device} "
                       "torch.compile runs with mode 'default' instead")


def run(args: argparse.Namespace, on_step_end=None) -> dict:
    """Train as the CLI does and return the summary dict (tests call this in-process).

    on_step_end(global_step): called on every rank after every batch, after a checkpoint that is
    due (`course_lib.distributed.faults` kills a rank there on purpose).
    """
    from .env import dist_info

    if args.resume and not args.checkpoint_dir:
        raise SystemExit("--resume needs --checkpoint-dir (where to look for last.pt)")
    if args.checkpoint_every and not args.checkpoint_dir:
        raise SystemExit("--checkpoint-every needs --checkpoint-dir (where to write last.pt)")
    if args.seed < 0:
        raise SystemExit(f"--seed must be >= 0; got {args.seed}")
    strategy = setup_strategy(args.strategy, args.device, dist_info(), tp=getattr(args, "tp", None))
    try:
        return _train(args, strategy, on_step_end)
    finally:
        strategy.close()


def _loaders(args, strategy):
    """(train loader, test loader): each data rank gets its own shard of the training set and scores its own
    block of the test set (one process: all of it); ranks that share a batch (fsdp_tp's tensor-parallel groups)
    share a data rank."""
    from .data import load_tensors, mnist_loaders
    from .rank_data import EvalShardLoader, ShardedTensorLoader

    info = strategy.info
    if strategy.distributed:
        if info.is_main:                     # download on rank 0 only, then everyone reads the files
            load_tensors("train", args.data_dir, args.train_subset)
        strategy.barrier()
    train_loader, test_loader = mnist_loaders(args.batch_size, args.data_dir, args.train_subset, strategy.device,
                                              args.seed)
    if args.train_subset and train_loader.dataset_size < args.train_subset:
        raise ValueError(f"--train-subset {args.train_subset:,} is more than the training set holds "
                         f"({train_loader.dataset_size:,} images); pass at most {train_loader.dataset_size:,}")
    train_loader = ShardedTensorLoader(*train_loader.tensors, batch_size=args.batch_size, rank=strategy.data_rank,
                                       world_size=strategy.data_world_size, seed=args.seed)   # 1: TensorLoader's order
    test_loader = EvalShardLoader(*test_loader.tensors, batch_size=test_loader.batch_size, rank=strategy.data_rank,
                                  world_size=strategy.data_world_size)    # each data rank scores its part
    return train_loader, test_loader


def _train(args, strategy, on_step_end=None) -> dict:
    from .env import seed_everything
    from .models import build_model, count_parameters

    info, device = strategy.info, strategy.device
    check_precision(args.precision, device, name="--precision")   # before any data is loaded
    log = None
    if info.is_main:
        log = print if not strategy.distributed else (
            lambda line: print(f"[rank 0 of {info.world_size}] {line}", flush=True))
    seed_everything(args.seed, info.rank)   # per-rank dropout; weights still equal: DDP broadcasts rank 0's
    train_loader, test_loader = _loaders(args, strategy)
    model = build_model(args.model).to(device)
    memory_format = resolve_memory_format(args.memory_format, model, strategy.shards_parameters)
    model = strategy.prepare(model.to(memory_format=memory_format))   # fsdp shards before the optimizer
    optimizer = make_optimizer(args.optimizer, model.parameters(), args.lr)
    scheduler = one_cycle(optimizer, args.lr, args.epochs, len(train_loader))
    scaler = grad_scaler(args.precision, device)      # fp16: None otherwise
    ckpt, start, skip = None, 0, 0
    if args.checkpoint_dir:
        ckpt = Checkpointer(args.checkpoint_dir, strategy, args.model, model, optimizer, scheduler, scaler,
                            len(train_loader), every=args.checkpoint_every)
        if args.resume:
            start, skip = ckpt.restore(device)
            if log and ckpt.resumed_step is not None:
                log(f"resumed from {ckpt.path} at epoch {start + 1}, batch {skip} (global step {ckpt.resumed_step})")
    steps_per_epoch = len(train_loader)

    def step_end(epoch, batches_done):
        if ckpt is not None:
            ckpt.on_step_end(epoch, batches_done)
        if on_step_end is not None:
            on_step_end(epoch * steps_per_epoch + batches_done)

    if log:
        log(f"training {args.model} ({count_parameters(model):,} parameters) on {device}, "
            f"{train_loader.dataset_size:,} training images, epochs {start + 1}..{args.epochs}"
            + (f", {info.world_size} ranks x batch {args.batch_size}" if strategy.distributed else ""))
    trained, compile_mode, compile_note = strategy.wrap(model), None, None
    if args.compile or args.compile_mode:
        compile_mode, compile_note = compile_mode_for(device, args.compile_mode or "default")
        if log and compile_note:
            log(f"note: {compile_note}")
        trained = torch.compile(trained, mode=compile_mode)
    history = fit(trained, train_loader, test_loader, epochs=max(args.epochs - start, 0),
                  optimizer=optimizer, device=device, scheduler=scheduler, log=log,
                  progress=not args.no_progress and info.is_main, start_epoch=start, skip_batches=skip,
                  on_step_end=step_end, on_epoch_end=ckpt.on_epoch_end if ckpt else None,
                  precision=args.precision, scaler=scaler, val_reduce=strategy.sum_over_data)
    if history.val_loss:     # fit evaluated the final weights after its last epoch: not a second pass
        test_loss, test_acc = history.val_loss[-1], history.val_accuracy[-1]
    else:                    # resumed at the end: no epoch ran
        test_loss, test_acc = evaluate(model, test_loader, device, strategy.sum_over_data)
    # the whole job: the sum over ranks, each batch once (fsdp_tp: tp ranks train on one batch)
    images_per_second = strategy.sum(history.mean_images_per_second) * strategy.data_world_size / info.world_size
    return {"model": args.model, "parameters": count_parameters(model), "device": str(device),
            "strategy": args.strategy, "precision": args.precision, "world_size": info.world_size,
            "memory_format": "channels_last" if memory_format is torch.channels_last else "contiguous",   # as the flag
            "compile": compile_mode is not None, "compile_mode": compile_mode, "compile_note": compile_note,
            "epochs": args.epochs, "epochs_run": len(history.train_loss),
            "batch_size": args.batch_size, "global_batch_size": args.batch_size * strategy.data_world_size, "lr": args.lr, "optimizer": args.optimizer,
            "seed": args.seed, "train_samples": train_loader.dataset_size, "test_samples": test_loader.dataset_size,
            "test_loss": round(test_loss, 6), "test_accuracy": round(test_acc, 6),
            "train_seconds": round(history.train_seconds, 3),
            "epoch_seconds": [round(t, 3) for t in history.epoch_seconds],       # this run's epochs, in order
            "epoch_test_accuracy": [round(a, 6) for a in history.val_accuracy],
            "images_per_second": round(images_per_second, 1),
            "images_per_second_note": "sum over ranks" if strategy.distributed else "one process",
            **model_flops_utilisation(args, strategy, images_per_second)}


def model_flops_utilisation(args, strategy, images_per_second: float) -> dict:
    """The summary's MFU keys (see the module docstring); global under ddp/fsdp: sums over the ranks.

    FLOPs are counted on a fresh model on the meta device (no memory, no random numbers drawn, the
    trained model untouched); every rank finds its peaks (cached per process), then they are summed.
    """
    from .flops import mfu, training_flops_per_image
    from .hardware import achievable_flops, peak_flops
    from .models import build_model

    with torch.device("meta"):
        counted = build_model(args.model)
    per_image = training_flops_per_image(counted, args.batch_size)
    dtype = check_precision(args.precision, strategy.device) or torch.float32
    peak, achievable = peak_flops(strategy.device, dtype), achievable_flops(strategy.device, dtype)
    total_peak, total_achievable = strategy.sum(peak.flops), strategy.sum(achievable.flops)
    summed = f"; per rank, summed over {strategy.info.world_size} ranks" if strategy.distributed else ""
    ran = images_per_second > 0                       # no epoch run (resumed at the end): both MFUs None
    return {"model_flops_per_image": per_image, "achieved_flops": round(per_image * images_per_second, 1),
            "peak_flops": round(total_peak, 1), "peak_source": peak.source + summed,
            "mfu": round(mfu(per_image, images_per_second, total_peak), 6) if ran else None,
            "achievable_flops": round(total_achievable, 1), "achievable_source": achievable.source + summed,
            "mfu_achievable": round(mfu(per_image, images_per_second, total_achievable), 6) if ran else None,
            "mfu_note": "sums over ranks" if strategy.distributed else "one process"}


def main(argv=None, on_step_end=None) -> int:
    from .data import MNISTNotFoundError
    from .env import DeviceUnavailableError, dist_info

    args = build_parser().parse_args(argv)
    try:
        summary = run(args, on_step_end)
    except (MNISTNotFoundError, DeviceUnavailableError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not dist_info().is_main:
        return 0
    print(f"test accuracy {100 * summary['test_accuracy']:.2f}% on {summary['test_samples']:,} images after "
          f"{summary['train_seconds']:.1f} s of training ({summary['images_per_second']:,.0f} images/s)")
    if summary["mfu"] is not None:
        kind = summary["peak_source"].split(":")[0]      # "theoretical", or "measured" where none can be derived
        print(f"MFU {100 * summary['mfu']:.2g}% of the {kind} peak ({summary['peak_flops'] / 1e9:,.0f} GFLOP/s), "
              f"{100 * summary['mfu_achievable']:.2g}% of the achievable ({summary['achievable_flops'] / 1e9:,.0f} "
              f"GFLOP/s, a measured matmul): {summary['achieved_flops'] / 1e9:.2f} GFLOP/s of model FLOPs "
              f"({summary['model_flops_per_image'] / 1e6:.2f} MFLOP per image); peak: {summary['peak_source']}")
    if args.json:
        print(json.dumps(summary))
    return 0


def _exit_without_teardown(code: int) -> None:
    """End a torchrun worker now: the process group is destroyed and the output is written.

    With gloo, a worker thread can still be releasing the last collective's tensors (which needs
    the GIL) while the interpreter shuts down; it is then killed inside the GIL and the process
    aborts (SIGABRT, "terminate called without an active exception"), failing a finished run.
    os._exit skips the interpreter's teardown, and with it the race.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cli(argv=None, on_step_end=None) -> None:
    """`python -m course_lib.train`: run `main` and exit; under a launcher, without interpreter teardown."""
    exit_code = main(argv, on_step_end)
    if "MASTER_ADDR" in os.environ:   # launched by torchrun (or SLURM): gloo or nccl has run
        _exit_without_teardown(exit_code)
    sys.exit(exit_code)


if __name__ == "__main__":
    cli()
