"""Checks for solutions/17_transformer_parallelism_exercises.ipynb: q/k/v rows by heads, the log-sum-exp merge,
expert dispatch with a capacity.

References are the library's own: `tensor_parallel.shard_range` (the rows a column-parallel rank owns) and
`vit.split_heads` (a head is head_dim consecutive output features); `context_parallel.block_attention` and
`merge`, themselves equal to F.scaled_dot_product_attention over all the keys (asserted here on every case);
`moe.dispatch_indices` (GShard's priority: token order, every first choice before any second choice).
A message names a mistake only when that mistake gives every result the answer gave.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import answer_source, call_answer, calls_function, expect, library_call, passed
from ..distributed.context_parallel import block_attention, merge
from ..distributed.moe import dispatch_indices
from ..distributed.tensor_parallel import shard_range

# --- exercise 1: q, k, v rows by heads ---------------------------------------------------------------

QKV_CASES = [(8, 2, 2), (16, 4, 4), (24, 4, 2), (64, 4, 4), (12, 6, 3), (32, 8, 2), (16, 4, 1), (36, 6, 2)]
REFUSED = [(24, 6, 4), (12, 4, 3), (8, 2, 4)]    # (dim, heads, world_size): heads not divisible by world_size


def _qkv_reference(ws, heads, rank, world_size):
    rows = shard_range(ws[0].shape[0], rank, world_size)
    return torch.cat([w[rows] for w in ws])


QKV_MISTAKES = [
    (lambda ws, h, r, n: torch.cat(ws).chunk(n)[r],
     "you cut the fused [3D, D] matrix [Wq; Wk; Wv] into N contiguous pieces: rank 0 then gets most of Wq and no "
     "v at all. Every rank needs q, k AND v of its own heads: cut each projection by heads, then stack the three"),
    (lambda ws, h, r, n: torch.cat([w[:, shard_range(w.shape[1], r, n)] for w in ws]),
     "you split the COLUMNS (input features). A column-parallel layer splits its output features, which are the "
     "ROWS of a weight stored [out, in]: rank r keeps rows r*D/N .. (r+1)*D/N - 1 of each of Wq, Wk, Wv"),
    (lambda ws, h, r, n: torch.cat([w[r * (h // n):(r + 1) * (h // n)] for w in ws]),
     "you cut rows r*H/N .. (r+1)*H/N - 1: that counts heads, not rows. Head h is the head_dim = D/H rows "
     "h*head_dim .. (h+1)*head_dim - 1, so rank r's H/N heads are rows r*D/N .. (r+1)*D/N - 1"),
]


def _head_of(block: torch.Tensor, ws, head_dim: int):
    """(projection, head) of ws that equals `block` [head_dim, D], as ("k", 2); None when it is no whole head."""
    for name, w in zip("qkv", ws):
        for h in range(w.shape[0] // head_dim):
            if torch.equal(block, w[h * head_dim:(h + 1) * head_dim]):
                return name, h
    return None


def _matches(fn, answers) -> bool:
    """Whether the mistake `fn(ws, heads, rank, world_size)` gives every answer's result."""
    try:
        return all(_same(fn(w, h, r, n), got) for w, h, r, n, got in answers)
    except Exception:  # noqa: BLE001 - a mistake that cannot even run on a case is not the answer's
        return False


def _heads_message(ws, heads, rank, world, got) -> str:
    """What the answer's rows hold, head_dim rows at a time, against what rank `rank` owns."""
    head_dim, per = ws[0].shape[0] // heads, heads // world
    found = [_head_of(got[i * head_dim:(i + 1) * head_dim], ws, head_dim) for i in range(3 * per)]
    expected = [(name, h) for name in "qkv" for h in range(rank * per, (rank + 1) * per)]
    shifts = {f[1] - e[1] for f, e in zip(found, expected) if f is not None and f[0] == e[0]}
    text = lambda hs: ", ".join(f"{n} head {h}" if (n, h) != (None, None) else "no whole head" for n, h in hs)  # noqa: E731
    shown = [f if f is not None else (None, None) for f in found]
    hint = (f" Every head is off by {shifts.pop():+d}: rank r's heads are r*H/N .. (r+1)*H/N - 1, counting from 0."
            if None not in found and len(shifts) == 1 and 0 not in shifts and
            all(f[0] == e[0] for f, e in zip(found, expected)) else
            " Rank r owns heads r*H/N .. (r+1)*H/N - 1 of EACH projection: its rows of Wq, then of Wk, then of Wv.")
    return f"your rows hold, head_dim = {head_dim} rows at a time: {text(shown)}; expected: {text(expected)}.{hint}"


def check_qkv_rows(qkv_rows) -> None:
    """`qkv_rows(wq, wk, wv, heads, rank, world_size)` -> [3D/N, D]: this rank's rows of Wq, then Wk, then Wv (its
    heads rank*H/N .. (rank+1)*H/N - 1); ValueError when world_size does not divide heads."""
    answers = []
    for dim, heads, world in QKV_CASES:
        g = torch.Generator().manual_seed(dim * 100 + heads * 10 + world)
        ws = [torch.randn(dim, dim, generator=g) for _ in range(3)]
        kept = [w.clone() for w in ws]
        for rank in range(world):
            got = call_answer(qkv_rows, *ws, heads, rank, world, what=f"qkv_rows(D={dim}, heads={heads}, rank={rank}, "
                              f"world_size={world})")
            expect(all(torch.equal(a, b) for a, b in zip(ws, kept)),
                   "qkv_rows changed the weights it was given: return new tensors, leave wq, wk, wv as they are")
            expect(isinstance(got, torch.Tensor), f"qkv_rows must return one tensor [3*D/N, D]; got {type(got).__name__}")
            answers.append((ws, heads, rank, world, got))
    for ws, heads, rank, world, got in answers:
        want = _qkv_reference(ws, heads, rank, world)
        if got.shape == want.shape and torch.equal(got, want):
            continue
        where = f"D={ws[0].shape[0]}, heads={heads}, rank {rank} of {world}"
        named = next((why for fn, why in QKV_MISTAKES if _matches(fn, answers)), "")
        if named:
            raise AssertionError(f"{where}: {named}.")
        expect(got.shape == want.shape, f"{where}: expected shape {tuple(want.shape)} ([3*D/N, D]: the rank's rows "
               f"of Wq, of Wk and of Wv, stacked), got {tuple(got.shape)}")
        raise AssertionError(f"{where}: {_heads_message(ws, heads, rank, world, got)}")
    for dim, heads, world in REFUSED:
        ws = [torch.randn(dim, dim) for _ in range(3)]
        try:
            got = qkv_rows(*ws, heads, 0, world)
        except ValueError:
            continue
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - the answer's own error, named below
            raise AssertionError(f"heads={heads}, world_size={world}: raise ValueError (naming heads and world_size), "
                                 f"not {type(exc).__name__}: {exc}") from None
        raise AssertionError(f"heads={heads}, world_size={world}, D={dim}: you returned rows of shape "
                             f"{tuple(getattr(got, 'shape', ()))}, but {heads} heads do not divide among {world} ranks: "
                             "a rank would hold part of a head, whose softmax needs all of its head_dim features. "
                             "Raise ValueError when heads % world_size != 0.")
    passed("qkv_rows")


def _same(a, b) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)


# --- exercise 2: the log-sum-exp merge ---------------------------------------------------------------

# (leading shape, queries, head_dim, keys in block 1, keys in block 2, score scale: ~1, ~1000 and ~-1000)
MERGE_CASES = [((), 5, 4, 3, 6, 1.0), ((2, 3), 6, 8, 4, 4, 1.0), ((1,), 7, 4, 1, 9, 1.0), ((2, 1, 2), 3, 4, 5, 2, 1.0),
               ((1, 1), 1, 1, 1, 1, 1.0), ((2, 2), 4, 8, 3, 5, 1000.0), ((3,), 5, 4, 6, 2, -1000.0)]


def _blocks(lead, t, d, k1, k2, scale, seed):
    """Two blocks' [out1, lse1, out2, lse2] for queries [*lead, t, d], and the attention (out, lse) over all k1 + k2
    keys. scale: the size of the scores q k^T / sqrt(d); at +-1000 they are all near it, a few units apart."""
    g = torch.Generator().manual_seed(seed)
    b = int(torch.tensor(lead).prod()) if lead else 1
    q, k, v = (torch.randn(b, 1, n, d, generator=g) for n in (t, k1 + k2, k1 + k2))
    if abs(scale) > 1:
        u = torch.randn(d, generator=g)
        k = u + 0.01 * k
        q = scale * d ** 0.5 / (u @ u) * u + 0.01 * q
    one = block_attention(q, k[:, :, :k1], v[:, :, :k1])
    two = block_attention(q, k[:, :, k1:], v[:, :, k1:])
    full_out = F.scaled_dot_product_attention(q, k, v)
    full_lse = torch.logsumexp(q @ k.transpose(-2, -1) / d ** 0.5, dim=-1)
    out_shape, lse_shape = (*lead, t, d), (*lead, t)
    return ([one[0].reshape(out_shape), one[1].reshape(lse_shape), two[0].reshape(out_shape), two[1].reshape(lse_shape)],
            (full_out.reshape(out_shape), full_lse.reshape(lse_shape)))


MERGE_MISTAKES = [
    (lambda o1, l1, o2, l2: (o1 + o2) / 2, "out is the plain average of the two blocks' outputs: a block whose keys "
     "score higher (larger lse) must weigh more. Weight block i by exp(lse_i - lse)"),
    (lambda o1, l1, o2, l2: l1.exp()[..., None] * o1 + l2.exp()[..., None] * o2,
     "out is exp(lse1)*out1 + exp(lse2)*out2: the weights are not normalised (they must sum to 1): divide by "
     "exp(lse1) + exp(lse2), i.e. weight block i by exp(lse_i - lse)"),
]
LSE_MISTAKES = [
    (lambda l1, l2: torch.maximum(l1, l2), "lse is max(lse1, lse2): the merged denominator adds both blocks' sums, "
     "lse = log(exp(lse1) + exp(lse2)) (torch.logaddexp)"),
    (lambda l1, l2: l1 + l2, "lse is lse1 + lse2, the log of a PRODUCT of the denominators; they add: "
     "lse = log(exp(lse1) + exp(lse2)) (torch.logaddexp)"),
    (lambda l1, l2: (l1 + l2) / 2, "lse is the mean of lse1 and lse2; the denominators add: "
     "lse = log(exp(lse1) + exp(lse2)) (torch.logaddexp)"),
]


def check_merge_blocks(merge_blocks) -> None:
    """`merge_blocks(out1, lse1, out2, lse2)` -> (out, lse): two blocks' attention over disjoint keys merged into the
    attention over all of them, for any leading shape (out [..., T, D], lse [..., T]) and scores of any size."""
    used = library_call(merge_blocks, names=("context_parallel", "ring_attention", "block_attention")) or (
        "merge" if calls_function(answer_source(merge_blocks), "merge") else "")
    expect(not used, f"your answer uses the library's {used}: write the merge yourself (torch.exp, torch.logaddexp, "
           "torch.maximum are fine)")
    answers = []
    for i, (lead, t, d, k1, k2, scale) in enumerate(MERGE_CASES):
        inputs, (full_out, full_lse) = _blocks(lead, t, d, k1, k2, scale, seed=i)
        reference = merge(*inputs)
        tol = dict(atol=1e-5, rtol=1e-5) if abs(scale) == 1 else dict(atol=1e-3, rtol=1e-4)
        assert torch.allclose(reference[0], full_out, **tol) and torch.allclose(reference[1], full_lse, **tol), \
            "the check's reference disagrees with SDPA"     # the check's own premise, not the learner's answer
        kept = [x.clone() for x in inputs]
        got = call_answer(merge_blocks, *inputs, what=f"merge_blocks on out of shape {tuple(inputs[0].shape)}",
                          hint="Mind the shapes: out [..., T, D], lse [..., T]; lse[..., None] broadcasts over D.")
        expect(all(torch.equal(a, b) for a, b in zip(inputs, kept)),
               "merge_blocks changed its inputs: return new tensors, leave out1, lse1, out2, lse2 as they are")
        expect(isinstance(got, tuple) and len(got) == 2 and all(isinstance(x, torch.Tensor) for x in got),
               f"merge_blocks must return a tuple (out, lse) of two tensors; got {type(got).__name__}")
        answers.append((inputs, reference, got, scale, tol, lead))
    for inputs, (want_out, want_lse), (out, lse), scale, tol, lead in answers:
        where = f"out of shape {tuple(want_out.shape)} (leading {lead}), scores near {scale:g}"
        expect(out.shape == want_out.shape and lse.shape == want_lse.shape,
               f"{where}: expected out {tuple(want_out.shape)} and lse {tuple(want_lse.shape)}, got {tuple(out.shape)} "
               f"and {tuple(lse.shape)}. Work on the last dimensions only (out [..., T, D], lse [..., T]: "
               "lse[..., None] broadcasts over D), whatever the leading ones")
        if not torch.isfinite(out).all() or not torch.isfinite(lse).all():
            raise AssertionError(f"{where}: your result holds inf or NaN. exp(±1000) overflows (float32 reaches only "
                                 "e^88.7) or underflows to 0, and 0/0 or inf/inf is NaN: shift by the maximum first. "
                                 "exp(lse_i - lse) is always <= 1 (torch.logaddexp computes lse without overflow)")
        named = next((why for fn, why in MERGE_MISTAKES
                      if all(torch.allclose(fn(*a[0]), a[2][0], **a[4]) for a in answers if abs(a[3]) == 1)), "")
        expect(torch.allclose(out, want_out, **tol), f"{where}: out differs from attention over all the keys by "
               f"{(out - want_out).abs().max().item():.3g}. " + (named + "." if named else
               "out = exp(lse1 - lse)*out1 + exp(lse2 - lse)*out2, with lse the merged one"))
        named = next((why for fn, why in LSE_MISTAKES
                      if all(torch.allclose(fn(a[0][1], a[0][3]), a[2][1], **a[4]) for a in answers)), "")
        expect(torch.allclose(lse, want_lse, **tol), f"{where}: out is right, lse differs from the log-sum-exp of "
               f"all the scores by {(lse - want_lse).abs().max().item():.3g}. " + (named + "." if named else
               "lse = log(exp(lse1) + exp(lse2)), computed without overflow (torch.logaddexp)"))
    passed("merge_blocks")


# --- exercise 3: dispatch slots with a capacity ------------------------------------------------------

def _dispatch_cases() -> list:
    """(expert ids [T] or [T, k], capacity): hand cases where the mistakes differ, edges, seeded random ones."""
    t = torch.tensor
    cases = [(t([0, 1, 0, 0, 1, 0]), 2), (t([[0, 1], [1, 0], [0, 1], [1, 2]]), 2), (t([[2, 0], [2, 1], [0, 2]]), 1),
             (t([3, 3, 3]), 1), (t([5, 1, 5, 1, 5]), 0), (t([0, 0, 0]), 5), (t([4]), 1),
             (t([], dtype=torch.int64), 2), (torch.empty(0, 2, dtype=torch.int64), 1),
             (t([[1, 0, 2], [0, 1, 2], [2, 0, 1], [0, 2, 1]]), 2)]
    g = torch.Generator().manual_seed(17)
    for tokens, experts, k, capacity in [(40, 8, 1, 4), (40, 8, 2, 6), (30, 4, 3, 9), (64, 8, 2, 10), (25, 5, 1, 5)]:
        ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
        cases.append((ids if k > 1 else ids[:, 0], capacity))
    return cases


DISPATCH_MISTAKES = [
    (lambda e, c: dispatch_indices(e, 10 ** 9), "no token is ever dropped: an expert takes at most `capacity` "
     "tokens; the slot of a token that finds its expert full is -1"),
    (lambda e, c: dispatch_indices(e, c + 1), "each expert takes capacity + 1 tokens: slots count from 0, so the "
     "last kept slot is capacity - 1"),
    (lambda e, c: dispatch_indices(e, max(c - 1, 0)), "each expert takes capacity - 1 tokens: slots 0 .. "
     "capacity - 1 are all kept"),
    (lambda e, c: dispatch_indices(e.reshape(-1), c).view_as(e), "with k > 1 you serve token by token (token 0's "
     "choices, then token 1's, ...). GShard serves every token's FIRST choice before any token's second choice: "
     "walk the columns of expert_of_token, then the tokens"),
    (lambda e, c: dispatch_indices(e.flip(0), c).flip(0), "you keep the LAST tokens: slots are given in token "
     "order, so the first tokens to choose an expert get its slots and the later ones are dropped"),
]


def check_dispatch_slots(dispatch_slots) -> None:
    """`dispatch_slots(expert_of_token, capacity)` -> slots, the same shape: each (token, choice)'s slot in its
    expert's buffer in GShard's order, -1 when the expert already has `capacity` tokens."""
    used = library_call(dispatch_slots, names=("moe", "route")) or (
        "dispatch_indices" if calls_function(answer_source(dispatch_slots), "dispatch_indices") else "")
    expect(not used, f"your answer uses the library's {used}: write the slots yourself")
    answers = []
    for ids, capacity in _dispatch_cases():
        kept = ids.clone()
        got = call_answer(dispatch_slots, ids, capacity, what=f"dispatch_slots({ids.tolist()}, {capacity})")
        expect(torch.equal(ids, kept), "dispatch_slots changed expert_of_token: leave the tensor it was given as it is")
        expect(isinstance(got, torch.Tensor) and got.shape == ids.shape,
               f"expert_of_token of shape {tuple(ids.shape)}: return a tensor of the same shape (one slot per token "
               f"and choice); got {tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}")
        expect(not got.is_floating_point() and not got.is_complex(),
               f"slots are integers (int64, -1 for dropped); got dtype {got.dtype}")
        answers.append((ids, capacity, got))
    for ids, capacity, got in answers:
        want = dispatch_indices(ids, capacity)
        if torch.equal(got.long(), want):
            continue
        where = f"expert_of_token={ids.tolist()}, capacity={capacity}"
        named = next((why for fn, why in DISPATCH_MISTAKES
                      if all(torch.equal(fn(e, c), g.long()) for e, c, g in answers)), "")
        if named:
            raise AssertionError(f"{where}: you return {got.tolist()}, expected {want.tolist()}: {named}.")
        raise AssertionError(f"{where}: you return {got.tolist()}, expected {want.tolist()}. "
                             f"{_first_difference(ids, capacity, got.long(), want)}")
    passed("dispatch_slots")


def _first_difference(ids, capacity, got, want) -> str:
    """The first (choice, token) in GShard's order where the answer differs, and why the expected slot is what it is."""
    cols = ids if ids.dim() == 2 else ids[:, None]
    for choice in range(cols.shape[1]):
        for token in range(cols.shape[0]):
            index = (token, choice) if ids.dim() == 2 else (token,)
            if got[index] != want[index]:
                expert = int(cols[token, choice])
                before = [(c, s) for c in range(choice + 1) for s in range(cols.shape[0] if c < choice else token)
                          if int(cols[s, c]) == expert]
                return (f"Token {token}, choice {choice} -> expert {expert}: {len(before)} entries chose expert {expert} "
                        f"before it (choice, token: {before[:6]}), so its slot is "
                        f"{len(before) if len(before) < capacity else -1}; yours is {int(got[index])}. Order: every "
                        "token's first choice in token order, then every second choice, ...")
    return ""
