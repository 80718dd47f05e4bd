"""How the train CLI runs on one process or on many: the one seam between the loop and the launch.

    strategy = setup_strategy("ddp", "auto", dist_info())   # joins the process group (gloo/nccl)
    model = strategy.prepare(model)                          # fsdp: shard before the optimizer exists
    train_model = strategy.wrap(model)                       # ddp: DistributedDataParallel
    model_state, optimizer_state = strategy.state_dicts(model, optimizer)

`Strategy` is what every strategy shares: this rank's place in the job (`info`: rank, world size;
`device`), the process-group setup (`start`) and the collectives the script and the checkpoints
use (gather, barrier, sum), with hooks that do nothing by default. Its subclasses, siblings,
override what differs: `Single` is one process (no process group; collectives are local). `DDP`
wraps the model in DistributedDataParallel: every rank holds the whole model, gradients are
averaged. `FSDP` (FSDP2, `fully_shard` per layer) shards the model before the optimizer sees it,
so each rank keeps 1/N of the parameters, gradients and optimizer state; its checkpoints hold full
state dicts gathered to rank 0 (they load into an unsharded model), with the optimizer state keyed
by parameter name. `FSDPTP` (--tp N) is 2-D: tensor parallel inside each ViT block over N ranks,
FSDP2 over the world/N data-parallel ranks (`distributed.fsdp_tp`); the N ranks of one tensor-parallel
group train on the same batch, so its data rank and data world size (`data_rank`, `data_world_size`:
which shard of the data this rank loads, out of how many) are its dp coordinate and world/N, where
every other strategy's are its rank and world size. A new way to parallelise is one more subclass,
listed in STRATEGIES; the script and the checkpoints ask it what they need (its attributes), never
its name.
"""
from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from .env import DistInfo, get_device


class Strategy:
    """One process per rank in a process group (gloo on CPU, nccl on cuda:LOCAL_RANK); hooks that change nothing."""

    name = ""                        # the --strategy value
    distributed = True               # several processes: rank 0 downloads, logs and writes checkpoints
    shards_parameters = False        # each rank holds a slice of every parameter (no channels_last then)
    keys_optimizer_by_name = False   # its optimizer state dicts key the state by parameter name, not index
    tensor_parallel = False          # splits layers over --tp ranks (start takes tp=)

    def __init__(self, info: DistInfo, device: torch.device):
        self.info, self.device = info, device

    @property
    def data_rank(self) -> int:
        """Which shard of the training data this rank loads (ranks that must see the same batch share one)."""
        return self.info.rank

    @property
    def data_world_size(self) -> int:
        """Into how many shards the training data is cut: the number of different batches per step."""
        return self.info.world_size

    @classmethod
    def start(cls, device: str, info: DistInfo, **options) -> "Strategy":
        """Join the process group on this rank's device; SystemExit with the fix when the launch does not fit.

        options: the subclass's own constructor arguments (fsdp_tp: tp)."""
        if "MASTER_ADDR" not in os.environ:
            raise SystemExit(f"--strategy {cls.name} needs a launcher that sets RANK/WORLD_SIZE/MASTER_ADDR, e.g.\n"
                             f"  torchrun --standalone --nproc_per_node 2 -m course_lib.train --strategy {cls.name}")
        dev = _rank_device(device, info)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        elif dev.type != "cpu":
            raise SystemExit(f"--strategy {cls.name} runs on CPU (gloo) or CUDA (nccl), not {dev.type}")
        _join_process_group(info, dev)
        return cls(info, dev, **options)

    def prepare(self, model: nn.Module) -> nn.Module:
        """Change the model in place before the optimizer sees its parameters (fsdp shards it)."""
        return model

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module `fit` trains (ddp: a DistributedDataParallel around `model`)."""
        return model

    def state_dicts(self, model: nn.Module, optimizer) -> tuple[dict, dict]:
        """(model, optimizer) state dicts to checkpoint; every rank calls this."""
        return model.state_dict(), optimizer.state_dict()

    def load_state_dicts(self, model: nn.Module, optimizer, model_state: dict, optimizer_state: dict) -> None:
        """Inverse of `state_dicts`, on every rank."""
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)

    def gather(self, obj) -> list:
        """`obj` from every rank, in rank order."""
        out = [None] * self.info.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        """Wait for every rank."""
        dist.barrier()

    def sum(self, value: float) -> float:
        """The sum of `value` over the ranks."""
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.item()

    def sum_over_data(self, totals: torch.Tensor) -> torch.Tensor:
        """`totals` summed over the data shards: every rank's, counting once each group of ranks that share a
        data rank (fsdp_tp's tensor-parallel ranks hold equal totals for the same batches)."""
        totals = totals.clone()
        dist.all_reduce(totals)
        return totals / (self.info.world_size // self.data_world_size)

    def close(self) -> None:
        """Leave the process group."""
        if dist.is_initialized():
            dist.destroy_process_group()


class Single(Strategy):
    """One process, one device: no process group; every collective is local."""

    name = "single"
    distributed = False

    @classmethod
    def start(cls, device, info):
        if info.world_size > 1:
            raise SystemExit(f"WORLD_SIZE={info.world_size} but --strategy single: every rank would train its own "
                             "model on all the data. Use --strategy ddp, or run one process without torchrun.")
        return cls(info, get_device(device))

    def gather(self, obj):
        return [obj]

    def barrier(self):
        pass

    def sum(self, value):
        return value

    def sum_over_data(self, totals):
        return totals

    def close(self):
        pass


class DDP(Strategy):
    """Every rank holds the whole model; torch's DistributedDataParallel averages gradients in buckets."""

    name = "ddp"

    def wrap(self, model):
        ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)


class Sharded(Strategy):
    """What both sharding strategies share: checkpoints hold FULL state dicts, gathered to rank 0 (they load
    into an unsharded model; optimizer state keyed by parameter name) and resharded on load."""

    shards_parameters = True
    keys_optimizer_by_name = True    # full optimizer state dicts (get_optimizer_state_dict) are keyed by name

    def state_dicts(self, model, optimizer):
        from .distributed.sharding import full_state_dicts

        return full_state_dicts(model, optimizer)     # a collective: full tensors gathered to rank 0

    def load_state_dicts(self, model, optimizer, model_state, optimizer_state):
        from .distributed.sharding import load_full_state_dicts

        load_full_state_dicts(model, optimizer, model_state, optimizer_state)


class FSDP(Sharded):
    """FSDP2: each rank keeps 1/N of the parameters, gradients and optimizer state."""

    name = "fsdp"

    def prepare(self, model):
        from .distributed.sharding import shard_model

        shard_model(model)    # rank 0's weights, then fully_shard per layer: fully_shard changes the model itself
        return model


class FSDPTP(Sharded):
    """2-D: tensor parallel over `tp` ranks inside each ViT block, FSDP2 over the world/tp data-parallel ranks.

    The ranks of one tensor-parallel group (rank // tp alike) load the same batch. Checkpoints as FSDP's.
    """

    name = "fsdp_tp"
    tensor_parallel = True

    def __init__(self, info: DistInfo, device: torch.device, tp: int = 2):
        from .distributed.fsdp_tp import check_tp

        super().__init__(info, device)
        self.tp = check_tp(tp, info.world_size)

    @classmethod
    def start(cls, device, info, tp: int = 2):
        from .distributed.fsdp_tp import check_tp

        check_tp(tp, info.world_size)            # before joining: a wrong --tp fails at once, on every rank
        return super().start(device, info, tp=tp)

    @property
    def data_rank(self):
        return self.info.rank // self.tp       # the dp coordinate: rank = dp_index * tp + tp_index

    @property
    def data_world_size(self):
        return self.info.world_size // self.tp

    def prepare(self, model):
        from .distributed.fsdp_tp import parallelize_vit

        return parallelize_vit(model, self.tp)   # refuses a model without a TP plan, or heads tp does not divide


STRATEGY_CLASSES = {cls.name: cls for cls in (Single, DDP, FSDP, FSDPTP)}
STRATEGIES = tuple(STRATEGY_CLASSES)     # the --strategy choices


def _join_process_group(info: DistInfo, device: torch.device) -> None:
    timeout = datetime.timedelta(minutes=10)
    # After a torchrun restart the rendezvous store still holds the dead attempt's addresses: give
    # each attempt its own key space, or ranks connect to the old, gone peers (without this prefix
    # the restart tests in tests/test_multinode.py and tests/test_train_fsdp.py fail).
    store = dist.PrefixStore(
        f"attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}",
        dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), info.world_size,
                      is_master=False, timeout=timeout))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store,
                            rank=info.rank, world_size=info.world_size, timeout=timeout)


def _rank_device(device: str, info: DistInfo) -> torch.device:
    """This rank's device: cuda:LOCAL_RANK when this node has a GPU for each of its ranks.

    nccl refuses two ranks on one GPU, so with fewer GPUs than ranks on the node (LOCAL_WORLD_SIZE,
    set by torchrun) "auto" trains on the CPU with gloo and says so; an explicit cuda is an error.
    """
    dev = get_device(device)
    if dev.type != "cuda":
        return dev
    local_ranks, gpus = int(os.environ.get("LOCAL_WORLD_SIZE", "1")), torch.cuda.device_count()
    if info.local_rank < gpus and local_ranks <= gpus:
        return torch.device("cuda", info.local_rank)
    if device == "auto":
        if info.local_rank == 0:
            print(f"note: {local_ranks} ranks on this node but {gpus} GPU(s); nccl needs a GPU per rank, "
                  "so --device auto trains on the CPU (gloo)", file=sys.stderr, flush=True)
        return torch.device("cpu")
    raise SystemExit(f"--device {device}: {local_ranks} ranks on this node but {gpus} GPU(s); nccl needs a GPU "
                     f"per rank. Use --nproc_per_node {gpus} or --device cpu (gloo).")


def setup_strategy(name: str, device: str, info: DistInfo, tp: int | None = None) -> Strategy:
    """The strategy `name` (one of STRATEGIES) on `device`; all but single join the process group.

    tp: tensor-parallel ranks, for fsdp_tp only (default 2); ValueError naming --tp for any other
    strategy, or when it does not divide the world size. Raises SystemExit with the fix when the
    launch does not fit the strategy.
    """
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}; got {name!r}")
    cls = STRATEGY_CLASSES[name]
    if tp is None:
        return cls.start(device, info)
    if not cls.tensor_parallel:
        takes = [n for n, c in STRATEGY_CLASSES.items() if c.tensor_parallel]
        raise ValueError(f"--tp applies to --strategy {' or '.join(takes)} only; got --strategy {name}")
    return cls.start(device, info, tp=tp)
