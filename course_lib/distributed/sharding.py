"""Sharded data parallel training: ZeRO's memory arithmetic, a hand-sharded optimizer, FSDP2 helpers.

DDP keeps a full copy of everything on every rank. With Ψ parameters, mixed-precision Adam keeps
per rank 2Ψ bytes of fp16 parameters, 2Ψ of fp16 gradients and KΨ of optimizer state (K = 12: fp32
master weights, momentum and variance). ZeRO (Rajbhandari et al., 2020) shards one more of them
over the N ranks at each stage:

    DDP     2Ψ + 2Ψ + KΨ          ZeRO-2 (+ gradients)    2Ψ + (2 + K)Ψ/N
    ZeRO-1  2Ψ + 2Ψ + KΨ/N        ZeRO-3 (+ parameters)   (2 + 2 + K)Ψ/N

    from course_lib.distributed import sharding
    sharding.zero_memory(7.5e9, 64, stage=1)["total"] / 1e9     # 31.4 GB per rank (DDP: 120)

Activations come on top, per rank, whatever the stage (`activations=` bytes, see course_lib.activations);
`plot_zero_with_activations` shows them beside the model states, with and without checkpointing.

- `shard_range` / `ShardedOptimizer`: ZeRO by hand. Each rank owns one slice of the flattened
  parameters and keeps optimizer state for that slice only; a step reduce-scatters the gradients,
  updates the slice, and all-gathers the slices back into every rank's parameters.
- `shard_model`: FSDP2 (`torch.distributed.fsdp.fully_shard`) per layer, the way course_lib.train
  --strategy fsdp uses it, with FSDP2's knobs (reshard_after_forward, mixed precision, prefetch);
  `full_state_dicts` / `load_full_state_dicts` turn sharded weights and
  optimizer state into ordinary full state dicts for checkpoints, and back.
- `optimizer_state_bytes`, `parameter_bytes`, `gradient_bytes`: what THIS rank holds (a DTensor
  counts its local shard only). The workers that measure them live in `sharding_workers`.
"""
from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import nn

from ..validate import int_in_range, is_int, non_negative_int, one_of, positive_int, positive_number
from .ddp import broadcast_parameters

STAGES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
PARAM_BYTES, GRAD_BYTES = 2, 2          # fp16 parameters and gradients (mixed precision)

# Newer torch renamed the flat-tensor collectives and warns on the old names; both do the same.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# --- the memory formulas -------------------------------------------------------------------------

def _check_stage(stage) -> int:
    return one_of("stage", stage, sorted(STAGES), hint=" (0 = DDP, no sharding)")


def zero_memory(num_params, world_size: int, stage: int, k: float = 12, activations: float = 0) -> dict:
    """Bytes per rank for `num_params` (Ψ) parameters on `world_size` (N) ranks, by component.

    Returns {"parameters", "gradients", "optimizer_states", "activations", "total"} (floats, bytes).
    stage 0 is DDP; stage s >= 1 shards the optimizer states, then also the gradients (2), the
    parameters (3). k: optimizer-state bytes per parameter (12 for mixed-precision Adam, 4+4+4 fp32
    copies). activations: bytes of one rank's micro-batch activations (e.g.
    course_lib.activations.transformer_activation_bytes); no ZeRO stage shards them.
    """
    psi = float(positive_number("num_params", num_params))
    n = positive_int("world_size", world_size)
    _check_stage(stage)
    k = float(positive_number("k", k))
    if not isinstance(activations, (int, float)) or isinstance(activations, bool) or activations < 0:
        raise ValueError(f"activations must be a number of bytes >= 0; got {activations!r}")
    out = {"parameters": PARAM_BYTES * psi / (n if stage >= 3 else 1),
           "gradients": GRAD_BYTES * psi / (n if stage >= 2 else 1),
           "optimizer_states": k * psi / (n if stage >= 1 else 1),
           "activations": float(activations)}
    out["total"] = sum(out.values())
    return out


def zero_communication(num_params, world_size: int, stage: int) -> float:
    """Elements each rank sends per training step with ring collectives (notebook 05's costs).

    DDP all-reduces the gradients: 2(N-1)/N·Ψ. ZeRO-1/2 reduce-scatter the gradients ((N-1)/N·Ψ) and
    all-gather the updated parameters ((N-1)/N·Ψ): the same volume. ZeRO-3 all-gathers the parameters
    twice (forward and again in backward, having freed them in between): 3(N-1)/N·Ψ, 1.5x DDP.
    """
    psi = float(positive_number("num_params", num_params))
    n = positive_int("world_size", world_size)
    return (3 if _check_stage(stage) == 3 else 2) * (n - 1) / n * psi


def plot_zero_memory(num_params, world_sizes=tuple(2**i for i in range(11)), k: float = 12, ax=None):
    """Per-rank memory (GB) against the number of ranks for DDP and ZeRO-1/2/3, log-log; returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4))
    for stage, name in STAGES.items():
        gb = [zero_memory(num_params, n, stage, k)["total"] / 1e9 for n in world_sizes]
        ax.plot(world_sizes, gb, "o-", label=f"{name}: {gb[-1]:.3g} GB at N={world_sizes[-1]}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks N")
    ax.set_ylabel("memory per rank (GB)")
    ax.set_title(f"Ψ = {num_params / 1e9:g}B parameters, K = {k:g} (mixed-precision Adam)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return ax


def plot_zero_with_activations(num_params, world_size: int, activations: dict, k: float = 12, ax=None):
    """Stacked bars per ZeRO stage: model states, then one bar per entry of `activations` {label: bytes}.

    Shows what sharding cannot reach: each rank's own activations, which only checkpointing shrinks.
    """
    import matplotlib.pyplot as plt

    if not isinstance(activations, dict) or not activations:
        raise ValueError("activations must be a non-empty dict {label: bytes per rank}")
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(activations)
    for i, (label, act) in enumerate(activations.items()):
        mems = [zero_memory(num_params, world_size, stage, k, act) for stage in STAGES]
        xs = [stage + (i - (len(activations) - 1) / 2) * width for stage in STAGES]
        states = [(m["total"] - m["activations"]) / 1e9 for m in mems]
        ax.bar(xs, states, width, color="#4C72B0", edgecolor="white", label="model states" if i == 0 else None)
        ax.bar(xs, [m["activations"] / 1e9 for m in mems], width, bottom=states, color=f"C{i + 1}",
               edgecolor="white", label=f"activations, {label}")
    ax.set_xticks(list(STAGES), list(STAGES.values()))
    ax.set_ylabel("memory per rank (GB)")
    ax.set_title(f"Ψ = {num_params / 1e9:g}B parameters on N = {world_size} ranks, K = {k:g}")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small")
    return ax


# --- ZeRO by hand -------------------------------------------------------------------------------

def shard_range(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, stop) of the `n` flat elements that `rank` owns.

    Every shard is ceil(n/N) long, as if the vector were zero-padded to N·ceil(n/N) elements (equal
    sizes are what all-gather and reduce-scatter need); the last ranks' shards are cut at n, so they
    may be shorter or empty. Same sizes as torch.chunk, which FSDP2 uses on each parameter's dim 0.
    """
    positive_int("n", n)
    positive_int("world_size", world_size)
    int_in_range("rank", rank, 0, world_size - 1, hint=f" (world_size={world_size})")
    size = -(-n // world_size)
    return min(rank * size, n), min((rank + 1) * size, n)


class ShardedOptimizer:
    """ZeRO by hand: optimizer state for this rank's slice of the flattened parameters only.

    Use instead of DDP + optimizer (the model is not wrapped: `step` averages the gradients itself):
    1. reduce-scatter: flatten every gradient into one zero-padded vector [N·S] (S = ceil(Ψ/N)),
       sum over ranks and keep only this rank's slice [S], divided by N: DDP's mean, for the slice;
    2. `optimizer_class` steps on the slice (an ordinary tensor of S elements);
    3. all-gather the updated slices [N·S] and copy them back into every parameter.
    Reduce-scatter + all-gather move as many bytes as DDP's one all-reduce. Element-wise optimizers
    only (SGD, Adam, AdamW); one that needs whole tensors (LAMB's per-layer norms) would not match.
    Starting weights are broadcast from rank 0, as DDP does.
    """

    def __init__(self, params, optimizer_class, **defaults):
        self.params = [p for p in params if p.requires_grad]
        if not self.params or len({(p.dtype, p.device) for p in self.params}) != 1:
            raise ValueError("ShardedOptimizer needs parameters that all share one dtype and device")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = -(-self.numel // self.world_size)
        with torch.no_grad():
            for p in self.params:
                dist.broadcast(p, 0)
            start = self.rank * self.shard_size
            self.shard = self._flat([p.detach() for p in self.params])[start:start + self.shard_size].clone()
        self.shard.requires_grad_(True)
        self.optimizer = optimizer_class([self.shard], **defaults)

    def _flat(self, tensors) -> torch.Tensor:
        """One vector [N·S]: the tensors flattened and concatenated, zero-padded at the end."""
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return nn.functional.pad(flat, (0, self.world_size * self.shard_size - self.numel))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        grads = self._flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params])
        shard_grad = torch.empty_like(self.shard)
        _reduce_scatter_flat(shard_grad, grads)            # sum over ranks of this rank's slice
        self.shard.grad = shard_grad.div_(self.world_size)
        self.optimizer.step()
        full = torch.empty(self.world_size * self.shard_size, dtype=self.shard.dtype, device=self.shard.device)
        _all_gather_flat(full, self.shard.detach())
        for p, piece in zip(self.params, full[:self.numel].split([p.numel() for p in self.params])):
            p.copy_(piece.view_as(p))


# --- FSDP2 --------------------------------------------------------------------------------------

def shard_model(model: nn.Module, reshard_after_forward: bool | int | None = None, mp_policy=None,
                prefetch: int = 0) -> nn.Module:
    """FSDP2 in place: rank 0's weights everywhere, then `fully_shard` per layer (`shard_units`), then the root.

    Afterwards each parameter is a DTensor holding this rank's torch.chunk of its dim 0. One
    `fully_shard` per layer means forward all-gathers one layer at a time (and frees it after),
    so only one layer is ever whole; backward gathers it again and reduce-scatters its gradient.
    FSDP2's knobs, each trading memory per rank against communication:
    - reshard_after_forward: True frees a layer's gathered weights after its forward and gathers them
      again in backward (3Ψ per step, 1.5x DDP); False keeps every layer whole from its forward to its
      backward (2Ψ, DDP's volume, ZeRO-2's memory for the parameters); an int g keeps 1/g of each, so
      backward gathers among g ranks only (those of one node). None: True for the layers, False for the root.
    - mp_policy: e.g. MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) gathers
      and computes in bf16 (half the all-gather bytes) and reduce-scatters the gradients in fp32; the
      shards the optimizer updates stay fp32.
    - prefetch: k > 0 makes each layer issue the all-gathers of the next k layers (in forward and in
      backward) right after its own: they start earlier, and k more layers are whole at once. 0: FSDP2's
      implicit prefetch (backward prefetches one layer).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    _check_reshard(reshard_after_forward, dist.get_world_size())
    non_negative_int("prefetch", prefetch)
    if mp_policy is not None and not isinstance(mp_policy, MixedPrecisionPolicy):
        raise ValueError(f"mp_policy must be None or a torch.distributed.fsdp.MixedPrecisionPolicy; got {mp_policy!r}")
    broadcast_parameters(model)             # as DDP does: every rank starts from the same weights
    quiet_view_warning()
    mesh = init_device_mesh(next(model.parameters()).device.type, (dist.get_world_size(),))
    knobs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward,
             "mp_policy": mp_policy or MixedPrecisionPolicy()}
    layers = shard_units(model)
    for layer in layers:
        fully_shard(layer, **knobs)
    fully_shard(model, **knobs)
    if prefetch:
        for i, layer in enumerate(layers):
            layer.set_modules_to_forward_prefetch(layers[i + 1:i + 1 + prefetch])
            layer.set_modules_to_backward_prefetch(layers[max(i - prefetch, 0):i][::-1])
    return model


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules `shard_model` gives a `fully_shard` each, in forward order: the children that hold
    parameters, with a container's (nn.Sequential, nn.ModuleList: a ViT's `blocks`) items taken one by one,
    so that one transformer block, not the whole stack, is gathered at a time. Parameters of the model
    itself (a ViT's position embedding) go with the root's `fully_shard`."""
    units = []
    for child in model.children():
        items = list(child) if isinstance(child, (nn.Sequential, nn.ModuleList)) else [child]
        units += [m for m in items if any(True for _ in m.parameters())]
    return units


def quiet_view_warning() -> None:
    """Silence FSDP2's warning that a wrapped module returned a view (a ViT's patch embedding, on every rank,
    every run): it warns that an IN-PLACE op on that output would skip a hook, and no course model does one."""
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")


def _check_reshard(value, world_size: int):
    """reshard_after_forward: None, a bool, or an int g with 1 < g < N dividing N (FSDP2's rule)."""
    if value is None or isinstance(value, bool):
        return value
    if not is_int(value) or not 1 < value < world_size or world_size % value:
        raise ValueError(f"reshard_after_forward must be None, True, False or an int g with 1 < g < {world_size} "
                         f"dividing world_size={world_size}; got {value!r}")
    return value


def full_state_dicts(model: nn.Module, optimizer) -> tuple[dict, dict]:
    """(model, optimizer) full state dicts, gathered to rank 0 on the CPU; other ranks get {}.

    A collective: every rank must call it. The model's keys and shapes are those of the unsharded
    model (load it anywhere with load_state_dict); optimizer state is keyed by parameter name.
    """
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)


def load_full_state_dicts(model: nn.Module, optimizer, model_state: dict, optimizer_state: dict) -> None:
    """Inverse of `full_state_dicts` on every rank (each passes the full dicts): each keeps its shards."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=options)
    set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)


# --- what this rank holds ------------------------------------------------------------------------

def local_bytes(t: torch.Tensor) -> int:
    """Bytes of `t` on this rank: a DTensor's local shard, a plain tensor's whole storage of elements."""
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def parameter_bytes(module: nn.Module) -> int:
    return sum(local_bytes(p) for p in module.parameters())


def gradient_bytes(module: nn.Module) -> int:
    return sum(local_bytes(p.grad) for p in module.parameters() if p.grad is not None)


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of every tensor in `optimizer.state` on this rank (Adam: exp_avg, exp_avg_sq, step)."""
    return sum(local_bytes(v) for state in optimizer.state.values() for v in state.values()
               if isinstance(v, torch.Tensor))
