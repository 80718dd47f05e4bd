"""The energy table matches Horowitz (ISSCC 2014) as Han et al. cite it; estimates add up."""
import pytest

from course_lib import energy


def test_table_values_from_the_paper():
    e = energy.ENERGY_PJ
    # EIE (ISCA 2016) Table I / Deep Compression (ICLR 2016) Fig. 1: relative costs 1, 9, 31, 37, 50, 6400
    assert [e[k] for k in ("int32_add", "fp32_add", "int32_mult", "fp32_mult", "sram_read_32bit", "dram_read_32bit")] \
        == [0.1, 0.9, 3.1, 3.7, 5.0, 640.0]
    assert e["int8_add"] < e["int32_add"] and e["int8_mult"] < e["int32_mult"] and e["fp16_mult"] < e["fp32_mult"]
    assert 100 < e["dram_read_32bit"] / e["fp32_mult"] < 200
    assert energy.MAC_PJ["fp32"] == pytest.approx(4.6)


def test_estimates():
    est = energy.inference_energy_pj(macs=1000, dram_bytes=400, sram_bytes=40, mac="int8")
    assert est.compute_pj == pytest.approx(1000 * 0.23)
    assert est.dram_pj == pytest.approx(100 * 640) and est.sram_pj == pytest.approx(10 * 5)
    assert est.total_pj == pytest.approx(est.compute_pj + est.dram_pj + est.sram_pj)
    assert energy.fetch_energy_pj(4, "sram") == 5.0 and energy.fetch_energy_pj(0) == 0


@pytest.mark.parametrize("call, match", [
    (lambda: energy.inference_energy_pj(-1), "macs"),
    (lambda: energy.inference_energy_pj(1, mac="fp64"), "mac"),
    (lambda: energy.fetch_energy_pj(8, "hbm"), "memory"),
    (lambda: energy.fetch_energy_pj(-8), "nbytes"),
])
def test_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()
