"""Column- and row-parallel Linear from scratch against the unsharded layers and torch's tensor parallel."""
import pytest

from course_lib.distributed.launch import launch
from course_lib.distributed.tensor_parallel import compare_tensor_parallel, shard_range


def test_shard_range():
    assert [shard_range(12, r, 3) for r in range(3)] == [slice(0, 4), slice(4, 8), slice(8, 12)]
    with pytest.raises(ValueError, match="size=10 features cannot be split evenly over world_size=4"):
        shard_range(10, 0, 4)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size", [2, 4])
def test_tensor_parallel_equals_unsharded_and_torch(world_size):
    hidden, d_out = 16, 4
    for out in launch(compare_tensor_parallel, world_size, timeout=150):
        for key in ("column", "row", "mlp", "torch"):
            assert out[f"{key}_out"] < 1e-5 and out[f"{key}_grad"] < 1e-5, (key, out)
        assert out["local_weight_shapes"] == [(hidden // world_size, 8), (d_out, hidden // world_size)]
