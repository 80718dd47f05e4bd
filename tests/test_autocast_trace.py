"""Autocast traced: casts kept and marked inside the phases; which ops autocast runs in which dtype."""
import json

import pytest
import torch
from torch import nn

from course_lib import autocast_trace, precision


def small_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def test_bf16_steps_show_their_casts_and_fp32_steps_none_in_forward(tmp_path):
    x, y = torch.randn(8, 1, 4, 4), torch.randint(0, 4, (8,))
    fp32 = autocast_trace.record_steps(small_net(), x, y, "32", steps=2, label="fp32")
    bf16 = autocast_trace.record_steps(small_net(), x, y, "bf16", steps=2, label="bf16")
    for timeline in (fp32, bf16):
        assert [s.name for s in timeline.spans if s.depth == 0 and s.kind in ("forward", "backward")].count(
            "forward") == 2
        assert {"forward", "backward", "optimizer"} <= {s.kind for s in timeline.spans}
    casts = [s for s in bf16.spans if s.kind == "cast"]
    # per step, at least the input and both weights are cast to bf16 in forward (biases too, on CPU)
    assert len(casts) >= 2 * 3 and all(s.depth == 1 and s.name == autocast_trace.CAST_OP for s in casts)
    forwards = [s for s in bf16.spans if s.name == "forward"]
    inside = [c for c in casts if any(f.start_us <= c.start_us <= f.start_us + f.dur_us for f in forwards)]
    assert len(inside) >= 2 * 3
    assert len([s for s in fp32.spans if s.kind == "cast"]) < len(casts)
    data = json.loads(bf16.save_chrome(tmp_path / "bf16.json").read_text())
    assert sum(e.get("cat") == "cast" for e in data["traceEvents"]) == len(casts)


def test_record_steps_refuses_fp16_on_cpu_and_bad_steps():
    x, y = torch.randn(2, 16), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        autocast_trace.record_steps(small_net(), x, y, "16")
    with pytest.raises(ValueError, match="steps must"):
        autocast_trace.record_steps(small_net(), x, y, "32", steps=0)


def test_keep_casts_keeps_casts_collectives_and_device_copies():
    assert autocast_trace.keep_casts("aten::_to_copy") and autocast_trace.keep_casts("gloo:all_reduce")
    assert not autocast_trace.keep_casts("aten::addmm") and not autocast_trace.keep_casts("aten::copy_")


def test_native_bf16_reports_features():
    native, features = autocast_trace.native_bf16()
    assert isinstance(native, bool) and (features == "none") == (not native)


def test_cpu_autocast_lists_measured():
    dtypes = precision.autocast_output_dtypes("cpu")
    assert set(dtypes) == set(precision.AUTOCAST_PROBES)
    assert dtypes["linear"] == torch.bfloat16                                # lower-precision list
    assert dtypes["cross_entropy"] == dtypes["nll_loss"] == dtypes["mse_loss"] == torch.float32   # fp32 list
    # not on CPU's fp32 list (they are on CUDA's): a bf16 input stays bf16
    assert dtypes["softmax"] == dtypes["log_softmax"] == dtypes["sum"] == torch.bfloat16
    with pytest.raises(ValueError, match="device_type must be one of"):
        precision.autocast_output_dtypes("tpu")
    with pytest.raises(ValueError, match="device_type must be one of"):
        precision.autocast_op_names("tpu")


def test_dispatcher_lists_agree_with_the_measured_policies():
    """An op casts under CPU autocast exactly when the dispatcher has an AutocastCPU kernel for it."""
    cpu, cuda = precision.autocast_op_names("cpu"), precision.autocast_op_names("cuda")
    assert {"mm", "conv2d", "linear"} <= cpu & cuda and "relu" not in cpu | cuda
    assert {"softmax.int", "log_softmax.int", "sum"} <= cuda - cpu        # CUDA's fp32 list only
    policies = precision.autocast_policies("cpu")
    assert policies["linear"] == "lower precision" and policies["relu"] == "no rule"
    for name, (aten, _) in precision.AUTOCAST_PROBES.items():
        assert (policies[name] != "no rule") == (aten in cpu), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_autocast_runs_softmax_and_sum_in_fp32():
    policies = precision.autocast_policies("cuda", torch.float16)
    assert policies["linear"] == "lower precision" and policies["relu"] == "no rule"
    assert policies["softmax"] == policies["log_softmax"] == policies["sum"] == "fp32"
    cuda = precision.autocast_op_names("cuda")
    for name, (aten, _) in precision.AUTOCAST_PROBES.items():
        if name == "cross_entropy":      # no CUDA rule of its own: it runs log_softmax + nll_loss, both fp32
            continue
        assert (policies[name] != "no rule") == (aten in cuda), name
