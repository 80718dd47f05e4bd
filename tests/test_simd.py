"""SIMD helpers: lanes from register widths, the capability list, int8 matmul agreement (no timing asserts)."""
import pytest
import torch

from course_lib import simd


def test_lanes():
    assert simd.lanes(256, torch.float32) == 8 and simd.lanes(512, torch.float32) == 16
    assert simd.lanes(512, torch.int8) == 64 and simd.lanes(128, torch.float64) == 2
    with pytest.raises(ValueError, match="register_bits"):
        simd.lanes(0, torch.float32)


def test_supported_ends_at_native():
    caps = simd.supported()
    assert caps[0] == "default" and caps[-1] == torch.backends.cpu.get_cpu_capability().lower()


def test_native_capability_measured_in_process():
    native = simd.supported()[-1]
    timing = simd.by_capability([native])[native]
    assert timing.capability.lower() == native and set(timing.ns_per_element) == {"mul", "sum"}
    assert all(v > 0 for v in timing.ns_per_element.values())
    with pytest.raises(ValueError, match="capabilities"):
        simd.by_capability(["avx1024"])


def test_int8_matmul_agrees_or_is_absent():
    result = simd.int8_vs_fp32_matmul(32)        # raises if torch._int_mm and fp32 disagree
    assert result is None or (result.fp32_s > 0 and result.int8_s > 0)
