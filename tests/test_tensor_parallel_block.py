"""Tensor and sequence parallelism for the ViT's blocks: ours and torch's parallelize_module against one process,
collectives and activation bytes per rank against their closed forms (2 and 4 ranks, one launch each)."""
import pytest
import torch

from course_lib.distributed.launch import launch
from course_lib.distributed.tensor_parallel_block import (block_activation_numbers, block_communication,
                                                          compare_tensor_parallel_block, local_part,
                                                          saved_activation_bytes)
from course_lib.vit import Block

TOL = 1e-5     # fp32 on the CPU: a sum split over ranks adds in another order


@pytest.mark.parametrize("batch,seq,dim,heads", [(2, 16, 32, 4), (3, 49, 24, 2)])
def test_activation_formula_matches_one_process(batch, seq, dim, heads):
    block = Block(dim, heads)
    x = torch.randn(batch, seq, dim, requires_grad=True)
    measured = saved_activation_bytes(block, x)
    assert measured == 4 * block_activation_numbers(batch, seq, dim, heads)
    assert measured == 4 * block_activation_numbers(batch, seq, dim, heads, 1, sequence_parallel=True)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_sequence_parallel_moves_the_same_bytes_and_keeps_less(n):
    tp, sp = block_communication(2, 16, 32, n, False), block_communication(2, 16, 32, n, True)
    assert tp["ring_bytes"] == sp["ring_bytes"] == 2 * 2 * (n - 1) / n * 2 * 16 * 32 * 4
    assert sum(tp["calls"].values()) == 2 and sp["calls"] == {"all_gather": 2, "reduce_scatter": 2}
    one = block_activation_numbers(2, 16, 32, 4)
    tp_a, sp_a = (block_activation_numbers(2, 16, 32, 4, n, s) for s in (False, True))
    assert one > tp_a > sp_a and tp_a - sp_a == (2 * 2 * 16 * 32 + 4 * 2 * 16) * (n - 1) // n


def test_local_part():
    full = torch.arange(24.).view(4, 6)
    assert torch.equal(local_part(full, torch.empty(2, 6), 1, 2), full[2:])
    assert torch.equal(local_part(full, torch.empty(4, 3), 0, 2), full[:, :3])
    assert torch.equal(local_part(full, torch.empty(4, 6), 1, 2), full)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size", [2, 4])
def test_tensor_and_sequence_parallel_equal_one_process_and_torch(world_size):
    for rank, out in enumerate(launch(compare_tensor_parallel_block, world_size, timeout=270)):
        assert out["one_process_activation_bytes"] == 4 * block_activation_numbers(2, 16, 32, 4)
        for mode in ("tp", "sp"):
            assert out[f"{mode}_loss"] < TOL and out[f"{mode}_grad"] < TOL, (rank, mode, out)
            for step in ("forward", "backward"):
                assert out[f"{mode}_{step}"] == out[f"{mode}_formula"], (rank, mode, step, out)
            assert out[f"{mode}_activation_bytes"] == out[f"{mode}_activation_formula"], (rank, mode, out)
            if f"torch_{mode}_error" in out:
                assert mode == "sp", out["torch_tp_error"]        # ColwiseParallel/RowwiseParallel must run
                print(f"torch's SequenceParallel did not run here: {out['torch_sp_error']}")
                continue
            assert out[f"torch_{mode}_loss"] < TOL and out[f"torch_{mode}_grad"] < TOL, (rank, mode, out)
            assert out[f"torch_{mode}_vs_ours"] < TOL
            for step in ("forward", "backward"):
                assert out[f"torch_{mode}_{step}"] == out[f"{mode}_formula"], (rank, mode, step, out)
        assert out["sp_activation_bytes"] < out["tp_activation_bytes"] < out["one_process_activation_bytes"]
        assert out["sp_grad_all_reduce_bytes"] == 2 * 6 * 32 * 4          # depth 2: norms + row biases, fp32
