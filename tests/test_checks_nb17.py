"""The checks of exercise notebook 17 pass the reference solutions and fail stubs and wrong answers."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.checks.nb17 import _blocks, check_dispatch_slots, check_merge_blocks, check_qkv_rows
from course_lib.distributed.context_parallel import merge
from course_lib.distributed.moe import dispatch_indices
from nbtools import ROOT, notebook_namespace

NS = notebook_namespace(ROOT / "solutions" / "17_transformer_parallelism_exercises.ipynb")
qkv_rows, merge_blocks, dispatch_slots = NS["qkv_rows"], NS["merge_blocks"], NS["dispatch_slots"]


def stub(*args):
    raise NotImplementedError()


def test_reference_solutions_pass():
    check_qkv_rows(qkv_rows)
    check_merge_blocks(merge_blocks)
    check_dispatch_slots(dispatch_slots)


def test_stubs_fail():
    for check in (check_qkv_rows, check_merge_blocks, check_dispatch_slots):
        with pytest.raises(NotImplementedError):
            check(stub)


# --- exercise 1: q, k, v rows -------------------------------------------------------------------------

def refuses(fn):
    """`fn` with the solution's ValueError in front, so that each wrong answer fails for its own mistake."""
    def answer(wq, wk, wv, heads, rank, world_size):
        if heads % world_size:
            raise ValueError("heads")
        return fn(wq, wk, wv, heads, rank, world_size)
    return answer


def asserts(wq, wk, wv, heads, rank, world_size):
    assert heads % world_size == 0, "heads"
    return qkv_rows(wq, wk, wv, heads, rank, world_size)


def per(w, heads, world_size):
    return w.shape[0] // world_size


@pytest.mark.parametrize("wrong, words", [
    (refuses(lambda wq, wk, wv, h, r, n: torch.cat([wq, wk, wv]).chunk(n)[r]), "fused \\[3D, D\\] matrix"),
    (refuses(lambda wq, wk, wv, h, r, n: torch.cat([w.chunk(n, dim=1)[r] for w in (wq, wk, wv)])), "COLUMNS"),
    (refuses(lambda wq, wk, wv, h, r, n: torch.cat([w.chunk(n, dim=1)[r] for w in (wq, wk, wv)], dim=1)), "COLUMNS|shape"),
    (refuses(lambda wq, wk, wv, h, r, n: torch.cat([w[r * (h // n):(r + 1) * (h // n)] for w in (wq, wk, wv)])),
     "counts heads, not rows"),
    (refuses(lambda wq, wk, wv, h, r, n: torch.cat([w[(r * per(w, h, n) + w.shape[0] // h) % w.shape[0]:][:per(w, h, n)]
                                                     for w in (wq, wk, wv)])), "off by"),
    (refuses(lambda wq, wk, wv, h, r, n: torch.cat([w.view(h, -1, w.shape[1])[r::n].reshape(-1, w.shape[1])
                                                     for w in (wq, wk, wv)])), "expected: q head"),   # round robin
    (refuses(lambda wq, wk, wv, h, r, n: torch.cat([w[r * per(w, h, n):(r + 1) * per(w, h, n)] for w in (wk, wq, wv)])),
     "k head 0.*expected: q head 0"),
    (refuses(lambda wq, wk, wv, h, r, n: [w[r * per(w, h, n):(r + 1) * per(w, h, n)] for w in (wq, wk, wv)]),
     "one tensor"),
    (lambda wq, wk, wv, h, r, n: torch.cat([w[r * per(w, h, n):(r + 1) * per(w, h, n)] for w in (wq, wk, wv)]),
     "do not divide among"),                                          # never refuses
    (asserts, "raise ValueError.*not AssertionError"),
])
def test_wrong_qkv_rows_fail(wrong, words):
    with pytest.raises(AssertionError, match=f"(?s){words}"):
        check_qkv_rows(wrong)


def test_qkv_rows_that_change_the_weights_fail():
    def in_place(wq, wk, wv, heads, rank, world_size):
        out = qkv_rows(wq, wk, wv, heads, rank, world_size)
        wq.zero_()
        return out
    with pytest.raises(AssertionError, match="changed the weights"):
        check_qkv_rows(in_place)


def test_another_correct_qkv_rows_passes():
    def by_heads(wq, wk, wv, heads, rank, world_size):
        if heads % world_size:
            raise ValueError(f"world_size={world_size} must divide heads={heads}")
        mine = range(rank * heads // world_size, (rank + 1) * heads // world_size)
        return torch.cat([w.view(heads, -1, w.shape[1])[list(mine)].flatten(0, 1) for w in (wq, wk, wv)])
    check_qkv_rows(by_heads)


# --- exercise 2: the merge ----------------------------------------------------------------------------

def naive(out1, lse1, out2, lse2):           # right formula, but exp of the raw lse: overflows near 1000
    e1, e2 = lse1.exp(), lse2.exp()
    return (e1[..., None] * out1 + e2[..., None] * out2) / (e1 + e2)[..., None], torch.log(e1 + e2)


def right_out(lse_of):
    def answer(out1, lse1, out2, lse2):
        out, lse = merge_blocks(out1, lse1, out2, lse2)
        return out, lse_of(lse1, lse2)
    return answer


@pytest.mark.parametrize("wrong, words", [
    (lambda o1, l1, o2, l2: ((o1 + o2) / 2, torch.logaddexp(l1, l2)), "plain average"),
    (lambda o1, l1, o2, l2: (l1.exp()[..., None] * o1 + l2.exp()[..., None] * o2, torch.logaddexp(l1, l2)),
     "not normalised"),
    (naive, "inf or NaN.*shift by the maximum"),
    (right_out(torch.maximum), "lse is max\\(lse1, lse2\\)"),
    (right_out(lambda a, b: a + b), "PRODUCT"),
    (right_out(lambda a, b: (a + b) / 2), "mean of lse1 and lse2"),
    (right_out(lambda a, b: torch.log(a.exp() + b.exp())), "inf or NaN"),
    (lambda o1, l1, o2, l2: (torch.exp(l1 - torch.logaddexp(l1, l2)) * o1 + torch.exp(l2 - torch.logaddexp(l1, l2)) * o2,
                             torch.logaddexp(l1, l2)), "raised RuntimeError.*shapes"),   # lse not broadcast over D
    (lambda o1, l1, o2, l2: merge_blocks(o1.view(-1, *o1.shape[-2:]), l1.view(-1, l1.shape[-1]),
                                         o2.view(-1, *o2.shape[-2:]), l2.view(-1, l2.shape[-1])), "shape"),
    (lambda o1, l1, o2, l2: merge_blocks(o1, l1, o2, l2)[0], "tuple \\(out, lse\\)"),
    (lambda o1, l1, o2, l2: merge(o1, l1, o2, l2), "uses the library's merge"),
])
def test_wrong_merges_fail(wrong, words):
    with pytest.raises(AssertionError, match=f"(?s){words}"):
        check_merge_blocks(wrong)


def test_a_merge_that_changes_its_inputs_fails():
    def in_place(out1, lse1, out2, lse2):
        lse = torch.logaddexp(lse1, lse2)
        out1.mul_(torch.exp(lse1 - lse)[..., None])
        return out1 + torch.exp(lse2 - lse)[..., None] * out2, lse
    with pytest.raises(AssertionError, match="changed its inputs"):
        check_merge_blocks(in_place)


def test_another_correct_merge_passes():
    def shifted(out1, lse1, out2, lse2):        # max-shift by hand instead of logaddexp
        m = torch.maximum(lse1, lse2)
        w1, w2 = torch.exp(lse1 - m), torch.exp(lse2 - m)
        return (w1[..., None] * out1 + w2[..., None] * out2) / (w1 + w2)[..., None], m + torch.log(w1 + w2)
    check_merge_blocks(shifted)


@settings(max_examples=25, deadline=None)
@given(lead=st.lists(st.integers(1, 3), max_size=3), t=st.integers(1, 6), d=st.integers(1, 8),
       k1=st.integers(1, 6), k2=st.integers(1, 6), scale=st.sampled_from([1.0, 300.0, -300.0, 1000.0]))
def test_the_solution_merges_to_sdpa(lead, t, d, k1, k2, scale):
    inputs, (out, lse) = _blocks(tuple(lead), t, d, k1, k2, scale, seed=t * 7 + d)
    got_out, got_lse = merge_blocks(*inputs)
    tol = dict(atol=1e-5, rtol=1e-5) if scale == 1 else dict(atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(got_out, out, **tol)
    torch.testing.assert_close(got_lse, lse, **tol)


def test_the_check_inputs_match_sdpa_on_a_plain_case():
    q, k, v = (torch.randn(1, 1, n, 4) for n in (3, 5, 5))
    (o1, l1, o2, l2), (out, _) = _blocks((), 3, 4, 2, 3, 1.0, seed=0)
    assert out.shape == (3, 4) and o1.shape == (3, 4) and l1.shape == (3,)
    torch.testing.assert_close(merge(o1, l1, o2, l2)[0], out, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v).shape, torch.Size([1, 1, 3, 4]))


# --- exercise 3: dispatch slots -----------------------------------------------------------------------

def python_slots(ids, capacity, order, keep):
    """Slots for the entries visited in `order` (a list of index tuples), keeping an entry when keep(count, cap)."""
    out, taken = torch.full_like(ids, -1), {}
    for index in order:
        e = int(ids[index])
        if keep(taken.get(e, 0), capacity):
            out[index] = taken.get(e, 0)
        taken[e] = taken.get(e, 0) + 1
    return out


def gshard_order(ids):
    cols = ids if ids.dim() == 2 else ids[:, None]
    return [(t, c) if ids.dim() == 2 else (t,) for c in range(cols.shape[1]) for t in range(cols.shape[0])]


def token_order(ids):
    cols = ids if ids.dim() == 2 else ids[:, None]
    return [(t, c) if ids.dim() == 2 else (t,) for t in range(cols.shape[0]) for c in range(cols.shape[1])]


def by_expert(ids, capacity):
    """Visits the entries expert by expert, each expert's entries last token first: drops by expert order."""
    order = sorted(gshard_order(ids), key=lambda i: (int(ids[i]), -i[0]))
    return python_slots(ids, capacity, order, lambda n, c: n < c)


@pytest.mark.parametrize("wrong, words", [
    (lambda ids, c: python_slots(ids, c, gshard_order(ids), lambda n, cap: True), "no token is ever dropped"),
    (lambda ids, c: python_slots(ids, c, gshard_order(ids), lambda n, cap: n <= cap), "capacity \\+ 1 tokens"),
    (lambda ids, c: python_slots(ids, c, gshard_order(ids), lambda n, cap: n < cap - 1), "capacity - 1 tokens"),
    (lambda ids, c: python_slots(ids, c, token_order(ids), lambda n, cap: n < cap), "token by token"),
    (lambda ids, c: python_slots(ids, c, gshard_order(ids)[::-1], lambda n, cap: n < cap), "expected"),
    (lambda ids, c: python_slots(ids.flip(0), c, gshard_order(ids), lambda n, cap: n < cap).flip(0), "LAST tokens"),
    (by_expert, "Token .* choice .* entries chose expert"),
    (lambda ids, c: dispatch_slots(ids, c).float(), "integers"),
    (lambda ids, c: dispatch_slots(ids, c).reshape(-1), "same shape"),
    (lambda ids, c: dispatch_indices(ids, c), "uses the library's dispatch_indices"),
])
def test_wrong_dispatch_slots_fail(wrong, words):
    with pytest.raises(AssertionError, match=f"(?s){words}"):
        check_dispatch_slots(wrong)


def test_dispatch_slots_that_change_their_input_fail():
    def sorts_in_place(ids, capacity):
        out = dispatch_slots(ids.clone(), capacity)
        ids.zero_()
        return out
    with pytest.raises(AssertionError, match="changed expert_of_token"):
        check_dispatch_slots(sorts_in_place)


def test_another_correct_dispatch_passes():
    def with_cumsum(ids, capacity):                 # one-hot and cumsum, vectorised
        order = ids.t().reshape(-1)
        if order.numel() == 0:
            return ids.clone()
        seen = F.one_hot(order, int(order.max()) + 1).cumsum(0).gather(1, order[:, None]).squeeze(1) - 1
        return torch.where(seen < capacity, seen, -1).view(ids.t().shape).t()
    check_dispatch_slots(with_cumsum)


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(0, 30), experts=st.integers(1, 6), k=st.integers(1, 3), capacity=st.integers(0, 8),
       seed=st.integers(0, 10_000))
def test_the_solution_is_the_library_dispatch(tokens, experts, k, capacity, seed):
    k = min(k, experts)
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)]) if tokens else \
        torch.empty(0, k, dtype=torch.int64)
    assert torch.equal(dispatch_slots(ids, capacity), dispatch_indices(ids, capacity))
    assert torch.equal(dispatch_slots(ids[:, 0], capacity), dispatch_indices(ids[:, 0], capacity))
