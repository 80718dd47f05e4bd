"""The SPMD program on a 2 x 2 (dp x tp) mesh against one process on the whole batch."""
import pytest

from course_lib.distributed.launch import launch
from course_lib.distributed.spmd import holdings, max_difference, spmd_program, train_single


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_spmd_2x2_mesh_equals_single_process():
    ranks = launch(spmd_program, 4, timeout=150)
    assert max_difference(ranks, train_single()) < 1e-5
    assert [r["coords"] for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r["batch_rows"] for r in ranks] == [(0, 4), (0, 4), (4, 8), (4, 8)]
    for r in ranks:                       # column-parallel rows of W1 and b1, row-parallel columns of W2, b2 whole
        tp = r["coords"][1]
        assert r["local"] == {"0.weight": (8, 8), "0.bias": (8,), "2.weight": (4, 8), "2.bias": (4,)}
        assert r["shard"] == {"0.weight": f"[{8 * tp}:{8 * tp + 8}, :]", "0.bias": f"[{8 * tp}:{8 * tp + 8}]",
                              "2.weight": f"[:, {8 * tp}:{8 * tp + 8}]", "2.bias": "[:]"}
    assert holdings(ranks)[3]["0.weight"] == "[8:16, :] [8, 8]"


def test_spmd_world_size_must_match_mesh():
    with pytest.raises(ValueError, match=r"world_size=3 must equal dp \* tp = 2 \* 2"):
        spmd_program(0, 3)

