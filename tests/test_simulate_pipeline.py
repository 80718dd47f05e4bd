"""simulate.pipeline: GPipe and 1F1B replayed on a virtual clock, against the bubble formula and a measured step."""
import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from course_lib.distributed import pipeline, pipeline_trace, schedules
from course_lib.simulate.pipeline import (
    RecordedPipeline,
    StageRecord,
    compare_measured,
    gpt2_mlp_stack,
    record_stages,
    replay_pipeline,
)
from course_lib.simulate.profiles import Link, Profile, h100_node
from course_lib.simulate.record import Event, Recorder

FREE = Link(0.0, float("inf"))            # a message costs nothing
CLOCK = Profile("clock", peak_flops=1e12, mem_GBps=1e3, gpus_per_node=8, intra=FREE, inter=FREE,
                eff_flops=1.0, eff_bw=1.0, host_s=0.0)     # an op of 1e9 FLOPs takes 1 ms


def equal_stages(K, tf=1e-3, tb=2e-3, t_opt=5e-4, nbytes=1e6) -> RecordedPipeline:
    """K stages whose forward takes tf, backward tb and optimizer t_opt on CLOCK; messages of `nbytes`."""
    one = lambda phase, s: [Event("aten.mm", phase, flops=s * 1e12)]
    return RecordedPipeline([StageRecord(one("forward", tf), one("backward", tb), one("optimizer", t_opt),
                                         0.0 if k == K - 1 else nbytes, 0.0 if k == 0 else nbytes, 1e6)
                             for k in range(K)], "equal stages")


@pytest.mark.parametrize("schedule", schedules.SCHEDULES)
@pytest.mark.parametrize("K,M", [(2, 1), (2, 4), (4, 6), (4, 16), (3, 2)])
def test_equal_stages_free_messages_replay_to_the_formula(schedule, K, M):
    tf, tb, t_opt = 1e-3, 2e-3, 5e-4
    p = replay_pipeline(equal_stages(K, tf, tb, t_opt), CLOCK, schedule, M, optimizer=False)
    assert p.step_s == pytest.approx((M + K - 1) * (tf + tb), rel=1e-12)
    assert p.bubble == pytest.approx((K - 1) / (M + K - 1), abs=1e-9) and p.formula == schedules.bubble_fraction(K, M)
    assert p.busy_s == pytest.approx([M * (tf + tb)] * K, rel=1e-12)
    assert p.peak_in_flight == schedules.predicted_peak_in_flight(schedule, K, M)
    for k in range(K):
        assert pipeline_trace.phase_order(p.timeline, f"stage {k} · compute") == schedules.order(schedule, K, M)[k]
    with_opt = replay_pipeline(equal_stages(K, tf, tb, t_opt), CLOCK, schedule, M)
    assert with_opt.step_s == pytest.approx(p.step_s + t_opt, rel=1e-12) and with_opt.bubble == p.bubble


def test_each_hop_adds_alpha_plus_bytes_times_beta_on_the_critical_path():
    tf, tb, nbytes = 1e-3, 2e-3, 1e6
    slow = Link(1e-4, 1.0)                          # 100 µs + 1 MB at 1 GB/s = 1.1 ms per message
    hop = 1e-4 + nbytes / 1e9
    for profile in (replace(CLOCK, intra=slow), replace(CLOCK, gpus_per_node=1, inter=slow)):   # 2 stages in / across nodes
        p = replay_pipeline(equal_stages(2, tf, tb, nbytes=nbytes), profile, "gpipe", 1, optimizer=False)
        assert p.step_s == pytest.approx(2 * (tf + tb) + 2 * hop, rel=1e-12)   # F0, send, F1, B1, send back, B0
        sends = [s for s in p.timeline.spans if s.kind == "comm"]
        assert [s.row for s in sends] == ["stage 0 · comm", "stage 1 · comm"]
        assert [s.dur_us for s in sends] == pytest.approx([hop * 1e6] * 2)
    p = replay_pipeline(equal_stages(2, tf, tb, nbytes=nbytes), replace(CLOCK, gpus_per_node=1, intra=slow), "gpipe", 1)
    assert p.step_s == pytest.approx(2 * (tf + tb) + 5e-4, rel=1e-12)          # K > gpus_per_node: the (free) inter link


def test_recorded_stages_of_make_mlp_count_the_unsplit_models_flops():
    model, (x, y) = pipeline.make_mlp(width=32, blocks=4), pipeline.make_batch(0, 8)
    rec = Recorder()
    with rec:
        F.cross_entropy(model(x), y).backward()
    unsplit = sum(e.flops for e in rec.events)
    model.zero_grad()
    with FlopCounterMode(display=False) as counter:                            # PyTorch's own count
        F.cross_entropy(model(x), y).backward()
    assert unsplit == counter.get_total_flops() > 0
    recorded = record_stages(pipeline.split_model(model, 2), x, F.cross_entropy, y)
    assert sum(s.flops() for s in recorded.stages) == unsplit
    first, last = recorded.stages
    assert first.send_bytes == last.grad_bytes == 8 * 32 * 4 and first.grad_bytes == last.send_bytes == 0
    assert {e.phase for s in recorded.stages for e in s.forward} == {"forward"}
    assert {e.phase for s in recorded.stages for e in s.backward} == {"backward"}
    assert all(p.grad is None for p in model.parameters())                    # recording leaves no gradients


def test_meta_device_records_a_large_model_by_shape(tmp_path):
    d, tokens = 256, 4 * 512
    with torch.device("meta"):
        stages = pipeline.split_model(gpt2_mlp_stack(blocks=4, d_model=d), 2)
        x = torch.empty(4, 512, d, dtype=torch.bfloat16)
    recorded = record_stages(stages, x, lambda out: out.float().mean())
    linear = 2 * tokens * d * 4 * d                                            # one Linear(d, 4d) forward
    for s in recorded.stages:
        assert s.flops("forward") == 2 * 2 * linear                            # 2 blocks of 2 Linears
        assert s.flops("backward") == 2 * s.flops("forward")                   # grads of input and weight
        assert s.saved_bytes >= 2 * tokens * 4 * d * 2                         # at least each block's [t, 4d] bf16
    assert recorded.stages[0].send_bytes == recorded.stages[1].grad_bytes == tokens * d * 2
    g, o = (replay_pipeline(recorded, h100_node(), name, 8) for name in ("gpipe", "1f1b"))
    assert g.activation_bytes == [8 * s.saved_bytes for s in recorded.stages]
    assert o.activation_bytes == [2 * recorded.stages[0].saved_bytes, recorded.stages[1].saved_bytes]
    assert 0 < g.bubble < 1 and g.step_s > 0
    data = json.loads(o.timeline.save_chrome(tmp_path / "sim.json").read_text())
    assert {e["name"] for e in data["traceEvents"] if e["ph"] == "X"} >= {"forward mb7", "backward mb0", "optimizer"}


def test_bad_arguments_name_the_argument_and_the_allowed_values():
    recorded = equal_stages(2)
    with pytest.raises(ValueError, match=r"schedule must be one of \('gpipe', '1f1b'\); got 'zb'"):
        replay_pipeline(recorded, CLOCK, "zb")
    with pytest.raises(ValueError, match="micro_batches must be a positive int; got 0"):
        replay_pipeline(recorded, CLOCK, micro_batches=0)
    with pytest.raises(TypeError, match="profile must be a Profile.*h100_node"):
        replay_pipeline(recorded, "h100_node")
    with pytest.raises(ValueError, match="recorded must be a RecordedPipeline"):
        replay_pipeline([], CLOCK)
    with pytest.raises(ValueError, match="stages must be a non-empty list of nn.Module"):
        record_stages([], torch.zeros(2, 20), F.cross_entropy)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_replay_of_the_measured_two_stage_step_has_its_order_and_roughly_its_time():
    result = compare_measured("gpipe", 4, steps=2, batch=128, width=512)   # bench simulate: the full size
    print(f"2-stage GPipe, M=4: measured {result['measured_s'] * 1e3:.1f} ms, predicted "
          f"{result['predicted_s'] * 1e3:.1f} ms, error {result['error']:+.0%}; bubble measured "
          f"{result['measured_bubble']:.0%}, predicted {result['predicted_bubble']:.0%} ({result['profile']})")
    assert result["measured_order"] == result["predicted_order"] == schedules.order("gpipe", 2, 4)
    assert 1 / 8 < result["predicted_s"] / result["measured_s"] < 8       # loose: CI machines are busy


def test_measured_stage_times_replace_the_roofline():
    K, M, tf, tb, t_opt = 3, 5, 2e-3, 3e-3, 1e-3
    roofline = equal_stages(K, tf=1.0, tb=1.0, t_opt=1.0)       # 1 s each on CLOCK: overridden below
    measured = [{"F": tf, "B": tb, "O": t_opt}] * K
    p = replay_pipeline(roofline, CLOCK, "1f1b", M, stage_seconds=measured)
    assert p.step_s == pytest.approx((M + K - 1) * (tf + tb) + t_opt, rel=1e-12)
    with pytest.raises(ValueError, match="stage_seconds must be 3 dicts"):
        replay_pipeline(roofline, CLOCK, "gpipe", M, stage_seconds=measured[:2])


def test_stage_times_worker_refuses_a_count_of_repeats_below_one():
    from course_lib.simulate.pipeline import stage_times_worker

    with pytest.raises(ValueError, match="repeats"):
        stage_times_worker(0, 2, repeats=0)   # checked before the worker touches the process group
