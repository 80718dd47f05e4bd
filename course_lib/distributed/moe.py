"""Mixture of experts from scratch, and expert parallelism: tokens travel to their experts by all-to-all.

An MoE MLP replaces one MLP by E experts (each Linear dim -> hidden, GELU, Linear hidden -> dim) and a
router (Linear dim -> E, softmax). Each token goes to its k most probable experts; its output is their
outputs weighted by gates. Compute per token stays that of k MLPs while the weights grow E-fold.

- gates: the chosen probabilities renormalised to sum to 1 when k > 1 (GShard, Mixtral); the plain
  probability when k = 1 (Switch: renormalising one gate would make it 1, and the router would get no
  gradient from the task loss). Ties between equal probabilities go to the lower expert index.
- capacity: an expert takes at most C = ceil(capacity_factor * S * k / E) of the S tokens of a group
  (GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021). Later tokens are DROPPED: their
  output from this layer is 0 (the residual connection around the layer carries them) and counted.
  Every token's first choice is served before any token's second choice (GShard's priority).
- groups: the batch [T, dim] is G groups of S = T/G tokens, each with its own capacity and its own
  auxiliary loss (GShard's groups). Under expert parallelism a group is one rank's tokens, so a rank
  decides its own drops without asking anyone; one process with groups=N computes the same thing.
- load-balancing loss (Switch): E * sum_e f_e * P_e, with f_e the fraction of the S*k (token, choice)
  assignments that chose expert e (before capacity) and P_e the mean router probability of e. Our
  convention divides by S*k, so perfectly balanced routing gives 1.0 for every k (Switch's k = 1 value);
  routing that collapses onto one expert with certainty gives E. Averaged over groups.

Expert parallelism on N ranks (E divisible by N): rank r holds experts r*E/N ... (r+1)*E/N - 1, a copy of
the router, and its own S tokens. Forward: route locally; exchange per-expert token counts (an
all-to-all of E integers); send each kept (token, choice) row to the rank of its expert (all-to-all
with uneven split sizes); run the local experts; send the results back by the inverse all-to-all;
combine with the gates. Backward runs the two all-to-alls the other way round (`_AllToAll`). The
router's gradient is then summed over ranks (an all-reduce, as DDP would), the experts' is not.
Bytes per rank per forward: 2 all-to-alls of about S*k*dim*4*(N-1)/N each (fewer when tokens drop),
the same again in backward.

    from course_lib.distributed.launch import launch
    from course_lib.distributed.moe import compare_expert_parallel
    launch(compare_expert_parallel, 4)  # max |difference| to one process; dropped; bytes vs formula
"""
from __future__ import annotations

import math
from collections import Counter
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..models import max_diff
from ..validate import int_in_range, non_negative_int, positive_int, positive_number


def expert_capacity(tokens: int, num_experts: int, k: int, capacity_factor: float) -> int:
    """Slots per expert for a group of `tokens`: ceil(capacity_factor * tokens * k / num_experts)."""
    # round() first: 1.1 * 10 * 1 / 1 is 11.000000000000002 in floats, and ceil would make it 12.
    return math.ceil(round(capacity_factor * tokens * k / num_experts, 9))


def dispatch_indices(expert_of_token: torch.Tensor, capacity: int) -> torch.Tensor:
    """The slot each token takes in its expert's buffer, or -1 when the expert is full (dropped).

    expert_of_token: [T] (k = 1) or [T, k] expert ids (int64, >= 0). Slots are given in token order;
    with k > 1, every token's first choice (column 0) before any second choice (GShard's priority).
    Returns the slots, the same shape: slot = how many entries before it, in that order, chose the same expert.
    """
    non_negative_int("capacity", capacity)
    if expert_of_token.dim() not in (1, 2):
        raise ValueError(f"expert_of_token must be [tokens] or [tokens, k]; got shape {tuple(expert_of_token.shape)}")
    order = expert_of_token.t().reshape(-1)                  # [k*T]: choice 0 of every token, then choice 1, ...
    if order.numel() == 0:
        return expert_of_token.clone()
    if order.min() < 0:
        raise ValueError(f"expert_of_token must hold expert ids >= 0; got {int(order.min())}")
    taken = F.one_hot(order, int(order.max()) + 1).cumsum(0)  # [k*T, E]: tokens so far per expert, this one included
    position = taken.gather(1, order[:, None]).squeeze(1) - 1   # [k*T]
    slot = torch.where(position < capacity, position, -1)
    return slot.view(expert_of_token.t().shape).t() if expert_of_token.dim() == 2 else slot


def load_balancing_loss(probs: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
    """Switch's auxiliary loss E * sum_e f_e * P_e of one group; probs [S, E], expert [S, k] -> scalar.

    f_e: share of the S*k assignments that chose e (counts: no gradient); P_e = probs[:, e].mean()."""
    num_experts = probs.shape[1]
    f = torch.bincount(expert.reshape(-1), minlength=num_experts).to(probs.dtype) / expert.numel()
    return num_experts * (f * probs.mean(0)).sum()


class Routing(NamedTuple):
    """Where T tokens go: expert, gate, slot [T, k] (slot -1: dropped); aux_loss (scalar); dropped: how many
    (token, choice) assignments found their expert full; capacity: slots per expert per group."""
    expert: torch.Tensor
    gate: torch.Tensor
    slot: torch.Tensor
    aux_loss: torch.Tensor
    dropped: int
    capacity: int


def route(router: nn.Linear, x: torch.Tensor, k: int, capacity_factor: float, groups: int = 1) -> Routing:
    """Top-k routing of x [T, dim] in `groups` groups of S = T/groups tokens (see the module docstring)."""
    positive_int("groups", groups)
    tokens, num_experts = x.shape[0], router.out_features
    if tokens % groups:
        raise ValueError(f"groups={groups} must divide the number of tokens ({tokens})")
    probs = router(x).softmax(-1)                                  # [T, E]
    top_p, expert = probs.sort(dim=-1, descending=True, stable=True)   # stable: ties go to the lower index
    top_p, expert = top_p[:, :k], expert[:, :k]                    # [T, k]
    gate = top_p / top_p.sum(-1, keepdim=True) if k > 1 else top_p
    size = tokens // groups
    capacity = expert_capacity(size, num_experts, k, capacity_factor)
    parts = range(0, tokens, size)
    slot = torch.cat([dispatch_indices(expert[i:i + size], capacity) for i in parts])
    aux = torch.stack([load_balancing_loss(probs[i:i + size], expert[i:i + size]) for i in parts]).mean()
    return Routing(expert, gate, slot, aux, int((slot < 0).sum()), capacity)


def apply_experts(experts: nn.ModuleList, rows: torch.Tensor, expert_of_row: torch.Tensor) -> torch.Tensor:
    """rows [R, dim], expert_of_row [R] (indices into `experts`) -> each row through its expert [R, dim]."""
    out = torch.zeros_like(rows)
    for j, expert in enumerate(experts):
        mine = (expert_of_row == j).nonzero().squeeze(1)
        out = out.index_copy(0, mine, expert(rows[mine]))
    return out


class MoEOutput(NamedTuple):
    """y [T, dim] (0 for a token whose every choice was dropped); aux_loss: scalar; dropped: int."""
    y: torch.Tensor
    aux_loss: torch.Tensor
    dropped: int


def _experts(num_experts: int, dim: int, hidden: int) -> nn.ModuleList:
    return nn.ModuleList(nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
                         for _ in range(num_experts))


class MoE(nn.Module):
    """E experts (dim -> hidden -> dim, GELU) and a top-k router, in one process: x [T, dim] -> MoEOutput."""

    def __init__(self, dim: int, hidden: int, num_experts: int, k: int = 1, capacity_factor: float = 1.0):
        super().__init__()
        positive_int("dim", dim)
        positive_int("hidden", hidden)
        positive_int("num_experts", num_experts)
        self.k = int_in_range("k", k, 1, num_experts, hint=" (at most num_experts)")
        self.capacity_factor = positive_number("capacity_factor", capacity_factor)
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = _experts(num_experts, dim, hidden)

    def forward(self, x: torch.Tensor, groups: int = 1) -> MoEOutput:
        if x.dim() != 2 or x.shape[1] != self.router.in_features:
            raise ValueError(f"x must be [tokens, {self.router.in_features}]; got shape {tuple(x.shape)}")
        r = route(self.router, x, self.k, self.capacity_factor, groups)
        token, choice = (r.slot >= 0).nonzero(as_tuple=True)           # the kept assignments, [kept] each
        rows = apply_experts(self.experts, x[token], r.expert[token, choice])
        y = torch.zeros_like(x).index_add(0, token, r.gate[token, choice, None] * rows)
        return MoEOutput(y, r.aux_loss, r.dropped)


def dense_moe(moe: MoE, x: torch.Tensor, groups: int = 1) -> MoEOutput:
    """Reference: EVERY expert on EVERY token ([T, E, dim]), weighted by the gate where kept, else 0."""
    r = route(moe.router, x, moe.k, moe.capacity_factor, groups)
    weight = torch.zeros(x.shape[0], len(moe.experts), dtype=x.dtype).scatter_add(1, r.expert, r.gate * (r.slot >= 0))
    every = torch.stack([expert(x) for expert in moe.experts], dim=1)   # [T, E, dim]
    return MoEOutput((weight[:, :, None] * every).sum(1), r.aux_loss, r.dropped)


class _AllToAll(torch.autograd.Function):
    """rows [sum(send), dim] -> [sum(recv), dim]: the first send[p] rows go to rank p, and recv[p] come from p.
    Backward: the same exchange the other way (send and recv swapped). `traffic` counts bytes sent off-rank."""

    @staticmethod
    def forward(ctx, rows, send, recv, traffic):
        ctx.send, ctx.recv, ctx.traffic = send, recv, traffic
        return _exchange(rows, send, recv, traffic, "forward")

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad.contiguous(), ctx.recv, ctx.send, ctx.traffic, "backward"), None, None, None


def _exchange(rows, send: list, recv: list, traffic: Counter, phase: str) -> torch.Tensor:
    out = rows.new_empty(sum(recv), rows.shape[1])
    dist.all_to_all_single(out, rows, output_split_sizes=recv, input_split_sizes=send)
    traffic[phase] += (sum(send) - send[dist.get_rank()]) * rows.shape[1] * rows.element_size()
    return out


class ExpertParallelMoE(nn.Module):
    """This rank's share of `full` (its E/N experts, a copy of the router): x [S, dim] -> MoEOutput of its tokens.

    `traffic` counts the bytes this rank sent to other ranks: "counts" (the per-expert counts), "forward"
    and "backward" (token rows, summed over the dispatch and the combine all-to-all)."""

    def __init__(self, full: MoE):
        super().__init__()
        rank, world = dist.get_rank(), dist.get_world_size()
        num_experts = len(full.experts)
        if num_experts % world:
            raise ValueError(f"num_experts={num_experts} must be divisible by world_size={world}")
        self.k, self.capacity_factor, self.num_experts = full.k, full.capacity_factor, num_experts
        self.per_rank = num_experts // world
        self.router = nn.Linear(full.router.in_features, num_experts, bias=False)
        self.router.load_state_dict(full.router.state_dict())
        self.experts = _experts(self.per_rank, full.router.in_features, full.experts[0][0].out_features)
        self.experts.load_state_dict(full.experts[rank * self.per_rank:(rank + 1) * self.per_rank].state_dict())
        self.traffic = Counter()

    def forward(self, x: torch.Tensor) -> MoEOutput:
        world = dist.get_world_size()
        r = route(self.router, x, self.k, self.capacity_factor)
        token, choice = (r.slot >= 0).nonzero(as_tuple=True)
        expert = r.expert[token, choice]
        order = expert.argsort(stable=True)               # rows grouped by expert, hence by destination rank
        token, choice, expert = token[order], choice[order], expert[order]
        # Counts first: the receiver must know how many rows come, and for which of its experts.
        send_counts = torch.bincount(expert, minlength=self.num_experts)          # [E]
        recv_counts = torch.empty_like(send_counts)                               # [N * E/N]: (source, my expert)
        dist.all_to_all_single(recv_counts, send_counts)
        self.traffic["counts"] += (world - 1) * self.per_rank * send_counts.element_size()
        send = send_counts.view(world, self.per_rank).sum(1).tolist()             # rows to each rank
        recv = recv_counts.view(world, self.per_rank).sum(1).tolist()             # rows from each rank
        arrived = _AllToAll.apply(x[token], send, recv, self.traffic)             # [sum(recv), dim]
        local_expert = torch.arange(self.per_rank).repeat(world).repeat_interleave(recv_counts)
        done = apply_experts(self.experts, arrived, local_expert)
        back = _AllToAll.apply(done, recv, send, self.traffic)                    # [kept, dim], in sent order
        y = torch.zeros_like(x).index_add(0, token, r.gate[token, choice, None] * back)
        return MoEOutput(y, r.aux_loss, r.dropped)


# --- worker for `launch` (tests and lecture 17) -------------------------------------------------------

def compare_expert_parallel(rank: int, world_size: int, tokens_per_rank: int = 16, dim: int = 8, hidden: int = 16,
                            num_experts: int = 8, k: int = 2, capacity_factor: float = 0.5,
                            aux_weight: float = 0.01) -> dict:
    """Expert parallelism against `dense_moe` of the same global batch in one process (groups = world_size).

    Loss: sum(v * y) / T + aux_weight * aux_loss, v fixed and random. Keys: "out", "loss", "x_grad",
    "router_grad", "expert_grad" (max |difference|; this rank's rows, experts); "dropped" and
    "dropped_reference" (this rank's group); "bytes" (this rank's traffic), "bytes_expected" (from the
    reference's routing: rows this rank sends to, and gets back from, other ranks) and "bytes_formula"
    (2 * kept * dim * 4 * (N-1)/N per forward, kept = S*k - dropped: the average under uniform routing).
    "bytes_balanced": traffic with exactly uniform top-1 routing, where the formula is exact
    ("bytes_balanced_formula" = 2 * S * dim * 4 * (N-1)/N).
    """
    torch.manual_seed(0)                                   # the same layer and global batch on every rank
    full = MoE(dim, hidden, num_experts, k, capacity_factor)
    tokens = tokens_per_rank * world_size
    x, v = torch.randn(tokens, dim), torch.randn(tokens, dim)
    mine = slice(rank * tokens_per_rank, (rank + 1) * tokens_per_rank)

    x_ref = x.clone().requires_grad_()
    ref = dense_moe(full, x_ref, groups=world_size)
    loss_ref = (v * ref.y).sum() / tokens + aux_weight * ref.aux_loss
    loss_ref.backward()

    ep = ExpertParallelMoE(full)
    x_mine = x[mine].clone().requires_grad_()
    out = ep(x_mine)
    loss = (v[mine] * out.y).sum() / tokens + aux_weight * out.aux_loss / world_size   # this rank's share
    loss.backward()
    dist.all_reduce(ep.router.weight.grad)                 # replicated router: sum its gradient, as DDP would
    total = loss.detach().clone()
    dist.all_reduce(total)

    r = route(full.router, x, k, capacity_factor, groups=world_size)
    owner = r.expert // ep.per_rank                        # [T, k]: rank holding each choice's expert
    group = (torch.arange(tokens) // tokens_per_rank)[:, None].expand_as(owner)
    kept = r.slot >= 0
    sent = (kept & (group == rank) & (owner != rank)).sum()
    received = (kept & (group != rank) & (owner == rank)).sum()
    experts = slice(rank * ep.per_rank, (rank + 1) * ep.per_rank)
    return {"out": max_diff(out.y, ref.y[mine]), "loss": abs(total.item() - loss_ref.item()),
            "x_grad": max_diff(x_mine.grad, x_ref.grad[mine]),
            "router_grad": max_diff(ep.router.weight.grad, full.router.weight.grad),
            "expert_grad": max_diff([p.grad for p in ep.experts.parameters()],
                                    [p.grad for p in full.experts[experts].parameters()]),
            "dropped": out.dropped, "dropped_reference": int((~kept[mine]).sum()),
            "bytes": dict(ep.traffic), "bytes_expected": int(sent + received) * dim * 4,
            "bytes_formula": 2 * int(kept[mine].sum()) * dim * 4 * (world_size - 1) / world_size,
            "bytes_balanced": _balanced_bytes(rank, world_size, tokens_per_rank, dim, hidden, num_experts),
            "bytes_balanced_formula": 2 * tokens_per_rank * dim * 4 * (world_size - 1) / world_size}


def _balanced_bytes(rank: int, world_size: int, tokens: int, dim: int, hidden: int, num_experts: int) -> dict:
    """Traffic of one forward and backward with perfectly balanced top-1 routing: token t goes to expert
    t mod E (router = identity, x = one-hot rows), no drops; so exactly (N-1)/N of the rows leave each rank."""
    if dim < num_experts or tokens % num_experts:
        raise ValueError(f"balanced routing needs dim >= num_experts and tokens_per_rank divisible by num_experts; "
                         f"got dim={dim}, num_experts={num_experts}, tokens_per_rank={tokens}")
    full = MoE(dim, hidden, num_experts, k=1, capacity_factor=1.0)
    with torch.no_grad():
        full.router.weight.copy_(torch.eye(num_experts, dim))
    ep = ExpertParallelMoE(full)
    x = 5 * torch.eye(num_experts, dim)[(torch.arange(tokens) + rank) % num_experts]
    out = ep(x.requires_grad_())
    out.y.sum().backward()
    return dict(ep.traffic)
