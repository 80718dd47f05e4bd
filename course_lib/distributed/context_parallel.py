"""Context parallelism from scratch: ring attention over a sequence (a ViT's patch tokens) split across N ranks.

Attention softmax(q k^T * scale) v needs every key for every query, so a long sequence cannot simply be cut
into chunks. It can be computed *blockwise*: attention of a query block over one key/value block gives a
partial result `out_i` and the log of its softmax denominator `lse_i` (log-sum-exp of the scores); two
partial results over disjoint key blocks combine exactly (the online softmax of Milakov & Gimelshein 2018,
used by FlashAttention):

    lse = logaddexp(lse_1, lse_2)
    out = exp(lse_1 - lse) * out_1 + exp(lse_2 - lse) * out_2

Ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers") puts this on N ranks: rank r
keeps its chunk of the queries and passes its key/value chunk to rank r+1 while receiving rank r-1's, N-1
times, merging one block's result per step; the next exchange runs while the current block is computed.
No rank ever holds the whole [tokens, tokens] score matrix or all keys at once. Each rank sends
(N-1) chunks of k and v per forward: 2*(N-1)/N * bytes(K) for K [batch, heads, tokens, head_dim] (v is as
large as k), when N divides tokens. Backward is a custom autograd.Function (`RingAttention`,
FlashAttention's backward per block): k, v go round again and the gradients dk, dv ride with them, N hops,
so each block's gradient arrives back at its owner: + 2 * bytes(K). ViT attention is not causal; with
causal=True a rank skips the blocks entirely in its future (rank 0 computes 1 block, rank N-1 all N).

torch's own `torch.distributed.tensor.experimental.context_parallel` rings only CUDA SDPA kernels;
`torch_context_parallel_reason` says why it cannot ring on this device, `torch_context_parallel_attention`
runs it anyway (compare_ring_attention(..., run_torch=True)).

    from course_lib.distributed.launch import launch
    from course_lib.distributed.context_parallel import compare_ring_attention
    launch(compare_ring_attention, 4)     # max |difference| to full attention in one process, bytes sent
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..models import max_diff
from ..validate import float_tensor, positive_int

NEG_INF = float("-inf")


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """lse with -inf (a query that may see no key of the block) replaced by 0: exp(-inf - 0) = 0, not NaN."""
    return lse.masked_fill(lse == NEG_INF, 0.0)


def _check_qkv(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        float_tensor(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name} must be [batch, heads, tokens, head_dim]; got shape {tuple(t.shape)}")
    if k.shape != v.shape or q.shape[:2] + q.shape[3:] != k.shape[:2] + k.shape[3:]:
        raise ValueError(f"q, k, v must share batch, heads and head_dim, and k, v their shape; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")


def _scores(q, k, scale, mask):
    """q k^T * scale: [B, H, Tq, Tk]; -inf where mask [Tq, Tk] is False."""
    s = (q @ k.transpose(-2, -1)) * scale
    return s if mask is None else s.masked_fill(~mask, NEG_INF)


def block_attention(q, k, v, scale: float | None = None, mask: torch.Tensor | None = None):
    """Attention of queries q [B, H, Tq, D] over one key/value block k, v [B, H, Tk, D] -> (out, lse).

    out [B, H, Tq, D] is softmax over this block's keys only; lse [B, H, Tq] the log of its denominator,
    logsumexp_j(q.k_j * scale). scale defaults to 1/sqrt(D). mask [Tq, Tk] bool, True where a query may see
    a key (causal attention); a query that sees no key of the block gets out 0 and lse -inf.
    """
    _check_qkv(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = _scores(q, k, scale, mask)
    lse = torch.logsumexp(s, dim=-1)                                   # stable: subtracts the row max
    return torch.exp(s - _finite(lse).unsqueeze(-1)) @ v, lse


def merge(out1, lse1, out2, lse2):
    """Combine two blocks' (out [B, H, T, D], lse [B, H, T]) over disjoint keys into theirs together.

    Each weight exp(lse_i - lse) is <= 1, so nothing overflows however large the scores are.
    """
    lse = torch.logaddexp(lse1, lse2)
    ref = _finite(lse).unsqueeze(-1)
    return torch.exp(lse1.unsqueeze(-1) - ref) * out1 + torch.exp(lse2.unsqueeze(-1) - ref) * out2, lse


def chunk_sizes(tokens: int, world_size: int) -> list[int]:
    """Tokens per rank, as torch.tensor_split cuts them: the first tokens % N ranks get one more."""
    positive_int("world_size", world_size)
    if not isinstance(tokens, int) or tokens < world_size:
        raise ValueError(f"tokens must be an int >= world_size={world_size} (one token per rank at least); "
                         f"got {tokens!r}")
    return [tokens // world_size + (r < tokens % world_size) for r in range(world_size)]


def chunk_range(tokens: int, rank: int, world_size: int) -> slice:
    """The positions rank `rank` holds in a sequence of `tokens` split by `chunk_sizes`."""
    sizes = chunk_sizes(tokens, world_size)
    return slice(sum(sizes[:rank]), sum(sizes[:rank + 1]))


def _causal_mask(tokens, world_size, q_rank, k_rank, device):
    """[Tq, Tk] bool: query position >= key position, for rank q_rank's queries and rank k_rank's keys."""
    qs, ks = chunk_range(tokens, q_rank, world_size), chunk_range(tokens, k_rank, world_size)
    qpos, kpos = torch.arange(qs.start, qs.stop, device=device), torch.arange(ks.start, ks.stop, device=device)
    return kpos.unsqueeze(0) <= qpos.unsqueeze(1)


def ring_bytes_sent(batch: int, heads: int, tokens: int, head_dim: int, world_size: int, rank: int,
                    element_size: int = 4) -> dict:
    """Bytes rank `rank` sends in one ring-attention forward and backward (closed form).

    Forward: every chunk of k and v but one, (rank+1)'s, which it holds last: 2*(N-1)/N * bytes(K) when N
    divides tokens. Backward: the same k, v chunks, plus dk, dv for all N chunks: + 2 * bytes(K) (N > 1).
    """
    row = batch * heads * head_dim * element_size               # bytes of one token of k (or v)
    sizes = chunk_sizes(tokens, world_size)
    forward = 2 * row * (tokens - sizes[(rank + 1) % world_size])
    return {"forward": forward, "backward": forward + (2 * row * tokens if world_size > 1 else 0)}


class _Ring:
    """Send tensors to rank+1 and receive as many from rank-1 (non-blocking), counting bytes sent."""

    def __init__(self, counter: dict, key: str):
        self.counter, self.key = counter, key
        self.rank, self.n = dist.get_rank(), dist.get_world_size()

    def start(self, tensors, recv_tokens: int) -> None:
        self.sent = [t.contiguous() for t in tensors]           # kept alive until wait()
        self.received = [t.new_empty(t.shape[:-2] + (recv_tokens, t.shape[-1])) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, (self.rank + 1) % self.n) for t in self.sent]
        ops += [dist.P2POp(dist.irecv, t, (self.rank - 1) % self.n) for t in self.received]
        self.requests = dist.batch_isend_irecv(ops)
        self.counter[self.key] += sum(t.numel() * t.element_size() for t in self.sent)

    def wait(self) -> list[torch.Tensor]:
        for req in self.requests:
            req.wait()
        return self.received


def _blocks(tokens, causal, device):
    """(step, source rank of the k/v block held at that step, its causal mask or None, skip?) for this rank."""
    rank, n = dist.get_rank(), dist.get_world_size()
    for step in range(n):
        src = (rank - step) % n
        mask = _causal_mask(tokens, n, rank, src, device) if causal else None
        yield step, src, mask, mask is not None and not bool(mask.any())   # a block entirely in the future


def _ring_forward(q, k, v, tokens, scale, causal, counter):
    ring, sizes, n = _Ring(counter, "forward"), chunk_sizes(tokens, dist.get_world_size()), dist.get_world_size()
    out = lse = None
    for step, src, mask, skip in _blocks(tokens, causal, q.device):
        if step < n - 1:
            ring.start([k, v], sizes[(src - 1) % n])            # next block travels while this one is computed
        if not skip:
            o, l = block_attention(q, k, v, scale, mask)
            out, lse = (o, l) if out is None else merge(out, lse, o, l)   # step 0 (own keys) is never skipped
        if step < n - 1:
            k, v = ring.wait()
    return out, lse


def _ring_backward(dout, q, k, v, out, lse, tokens, scale, causal, counter):
    """FlashAttention's backward per block: dS = P * (dO V^T - rowsum(dO * O)); dk, dv ride with their block."""
    ring, sizes, n = _Ring(counter, "backward"), chunk_sizes(tokens, dist.get_world_size()), dist.get_world_size()
    delta = (dout * out).sum(-1, keepdim=True)                  # [B, H, Tq, 1]
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for step, src, mask, skip in _blocks(tokens, causal, q.device):
        if step < n - 1:
            ring.start([k, v], sizes[(src - 1) % n])
        if not skip:
            p = torch.exp(_scores(q, k, scale, mask) - _finite(lse).unsqueeze(-1))   # [B, H, Tq, Tk], full softmax
            ds = p * (dout @ v.transpose(-2, -1) - delta) * scale
            dv = dv + p.transpose(-2, -1) @ dout
            dq = dq + ds @ k
            dk = dk + ds.transpose(-2, -1) @ q
        if step < n - 1:
            k, v = ring.wait()
        if n > 1:                                               # after the last step: home to their owner
            ring.start([dk, dv], sizes[(src - 1) % n])
            dk, dv = ring.wait()
    return dq, dk, dv


class RingAttention(torch.autograd.Function):
    """Ring attention with a ring backward: forward saves only (out, lse), never a [T, T] matrix."""

    @staticmethod
    def forward(ctx, q, k, v, tokens, scale, causal, counter):
        out, lse = _ring_forward(q, k, v, tokens, scale, causal, counter)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = tokens, scale, causal, counter
        return out

    @staticmethod
    def backward(ctx, dout):
        return (*_ring_backward(dout.contiguous(), *ctx.saved_tensors, *ctx.args), None, None, None, None)


def ring_attention(q, k, v, tokens: int, scale: float | None = None, causal: bool = False,
                   counter: dict | None = None) -> torch.Tensor:
    """This rank's chunk of softmax(Q K^T * scale) V over a sequence of `tokens` split by `chunk_sizes`.

    q, k, v [B, H, T_r, D]: this rank's chunks (T_r = chunk_sizes(tokens, N)[rank]) -> out [B, H, T_r, D].
    Differentiable; counter (a dict) gets "forward" and "backward" bytes this rank sent added to it.
    """
    _check_qkv(q, k, v)
    expected = chunk_sizes(tokens, dist.get_world_size())[dist.get_rank()]
    if q.shape[2] != expected or k.shape[2] != expected:
        raise ValueError(f"q and k must hold this rank's {expected} of tokens={tokens}; got "
                         f"{q.shape[2]} and {k.shape[2]}")
    counter = {"forward": 0, "backward": 0} if counter is None else counter
    counter.setdefault("forward", 0)
    counter.setdefault("backward", 0)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return RingAttention.apply(q, k, v, tokens, scale, causal, counter)


# --- torch's own context parallelism ------------------------------------------------------------------

def torch_context_parallel_reason(device_type: str = "cpu") -> str | None:
    """None when torch's context_parallel can run ring attention for SDPA on `device_type`; else why not.

    torch.distributed.tensor.experimental.context_parallel swaps in ring attention only for the SDPA kernels
    listed in its dispatcher (flash, memory-efficient, cuDNN: CUDA kernels). On CPU, SDPA runs
    aten._scaled_dot_product_flash_attention_for_cpu, which it does not handle: DTensor then propagates the
    sharding through that op's decomposition (matmuls, softmax): correct, but no ring, and the first call
    takes minutes of tracing on CPU.
    """
    try:
        from torch.distributed.tensor.experimental import context_parallel  # noqa: F401
        from torch.distributed.tensor.experimental._context_parallel._attention import custom_ops
    except (ImportError, AttributeError) as exc:
        return f"torch {torch.__version__} has no context parallel API here: {exc!r}"
    kernel = (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default if device_type == "cpu"
              else torch.ops.aten._scaled_dot_product_flash_attention.default)
    if kernel not in custom_ops:
        handled = ", ".join(sorted(str(op) for op in custom_ops if "backward" not in str(op)))
        return (f"torch {torch.__version__}: SDPA on {device_type} runs {kernel}, which context_parallel's ring "
                f"dispatcher does not handle (it handles: {handled})")
    return None


def torch_context_parallel_attention(q, k, v) -> torch.Tensor:
    """Full q, k, v [B, H, T, D] on every rank -> full SDPA output, computed by torch's context_parallel.

    Shards the three buffers along tokens (dim 2) over all ranks, runs F.scaled_dot_product_attention inside
    the context, and unshards the output. Minutes on CPU (see torch_context_parallel_reason).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    mesh = init_device_mesh(q.device.type, (dist.get_world_size(),))
    buffers = [q.clone(), k.clone(), v.clone()]
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2]):
        out = F.scaled_dot_product_attention(*buffers)
    return context_parallel_unshard(mesh, [out], [2])[0]


# --- worker for `launch` (tests and lecture 17) ---------------------------------------------------------

def compare_ring_attention(rank: int, world_size: int, batch: int = 2, heads: int = 2, tokens: int = 16,
                           head_dim: int = 8, run_torch: bool = False) -> dict:
    """Ring attention on this rank vs F.scaled_dot_product_attention on the whole sequence in one process.

    For causal False and True: "{name}_out" and "{name}_grad" (dq, dk, dv of this rank's chunk) max |diff|
    (name "full" or "causal"; fp32: expect < 1e-5), "{name}_bytes" {"forward", "backward"} sent, counted.
    "bytes_formula": ring_bytes_sent's closed form. "torch_cp_reason": why torch's context_parallel cannot
    ring here (None: it can). "torch_cp": its output vs full attention (max |diff|) when run_torch, else a
    note saying it was not run (it takes minutes on CPU).
    """
    torch.manual_seed(0)                                       # the same full q, k, v on every rank
    q, k, v = (torch.randn(batch, heads, tokens, head_dim) for _ in range(3))
    weight = torch.randn(batch, heads, tokens, head_dim)       # loss = sum(weight * out): every output its own grad
    mine = chunk_range(tokens, rank, world_size)
    out: dict = {"bytes_formula": ring_bytes_sent(batch, heads, tokens, head_dim, world_size, rank)}
    for name, causal in (("full", False), ("causal", True)):
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = F.scaled_dot_product_attention(*full, is_causal=causal)
        (weight * ref).sum().backward()
        local = [t[:, :, mine].clone().requires_grad_() for t in (q, k, v)]
        counter = {"forward": 0, "backward": 0}
        y = ring_attention(*local, tokens=tokens, causal=causal, counter=counter)
        (weight[:, :, mine] * y).sum().backward()
        out[f"{name}_out"] = max_diff(y, ref[:, :, mine])
        out[f"{name}_grad"] = max_diff([t.grad for t in local], [t.grad[:, :, mine] for t in full])
        out[f"{name}_bytes"] = counter
    out["torch_cp_reason"] = torch_context_parallel_reason(q.device.type)
    if run_torch:
        with torch.no_grad():
            theirs = torch_context_parallel_attention(q, k, v)
        out["torch_cp"] = max_diff(theirs, F.scaled_dot_product_attention(q, k, v))
    else:
        out["torch_cp"] = "not run (run_torch=False)"
    return out
