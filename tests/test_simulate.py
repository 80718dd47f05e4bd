"""course_lib.simulate: record the course's step, replay it on a virtual clock, against hand formulas."""
import json
import math
from dataclasses import replace

import pytest
import torch

from course_lib import trace
from course_lib.distributed.costmodel import allreduce_time, ring_time
from course_lib.distributed.ddp import assign_buckets
from course_lib.loop import make_optimizer
from course_lib.models import Net
from course_lib.simulate import (Event, Link, Profile, RankTrace, Recording, collective_seconds, cpu_this_machine,
                                 get_profile, record_ddp, replay)
from course_lib.simulate.__main__ import check_strategy, main
from course_lib.simulate.record import _batch, _train_step, record_step

TOY = Profile("toy", peak_flops=1e12, mem_GBps=100.0, gpus_per_node=8, intra=Link(1e-5, 10.0),
              inter=Link(1e-4, 1.0), eff_flops=0.5, eff_bw=0.5, launch_s=2e-6)


def toy_recording(world=2):
    """One matmul (2·256³ FLOPs), its gradient's all-reduce (4 MB), one optimizer op that waits for it."""
    n = 256
    mm = Event("aten.mm", "backward", flops=2.0 * n**3, bytes=3.0 * n * n * 4)
    ar = Event("all_reduce", "backward", "comm", bytes=4e6, after=[0], group_size=world)
    opt = Event("aten.add_", "optimizer", bytes=8e6, after=[1])
    ranks = [RankTrace([mm, ar, opt], [0]) for _ in range(world)]
    return Recording(ranks, [["w", 1_000_000, 4]], world_size=world, batch_per_rank=1, label="toy")


def test_hand_computable_step_replays_to_the_formula():
    n = 256
    t_mm = max(2 * n**3 / (1e12 * 0.5), 3 * n * n * 4 / (100e9 * 0.5)) + 2e-6      # compute-bound here
    t_ar = 2 * (2 - 1) * 1e-5 + 2 * (2 - 1) / 2 * 4e6 / 10e9                      # ring, 2 ranks, NVLink-ish
    t_opt = 8e6 / (100e9 * 0.5) + 2e-6                                             # memory-bound
    p = replay(toy_recording(), TOY)
    assert p.step_s == pytest.approx(t_mm + t_ar + t_opt, rel=1e-12)
    assert p.compute_s == pytest.approx(t_mm + t_opt, rel=1e-12)
    assert p.exposed_comm_s == pytest.approx(t_ar, rel=1e-9)
    assert p.mfu == pytest.approx(2 * n**3 / (p.step_s * 1e12))
    assert {s.kind for s in p.timeline.spans} == {"backward", "comm", "optimizer"}
    assert p.timeline.rows == ["rank 0 · compute", "rank 0 · comm", "rank 1 · compute", "rank 1 · comm"]


def test_larger_world_follows_alpha_beta_and_hierarchy():
    rec = toy_recording()
    comm = {w: replay(rec, TOY, world=w).comm_s for w in (1, 2, 4, 8, 64)}
    assert comm[1] == 0.0
    for w in (2, 4, 8):   # one node: a ring over NVLink-ish
        assert comm[w] == pytest.approx(ring_time(4e6, w, 1e-5, 1e-10), rel=1e-12)
    hier = ring_time(4e6, 8, 1e-5, 1e-10) + ring_time(4e6 / 8, 8, 1e-4, 1e-9)       # 8 nodes of 8
    assert comm[64] == pytest.approx(hier, rel=1e-12)
    assert comm[1] < comm[2] < comm[4] < comm[8] < comm[64]
    flat = collective_seconds("all_reduce", 4e6, 64, TOY, "tree", hierarchical=False)
    assert flat == pytest.approx(allreduce_time("tree", 4e6, 64, 1e-4, 1e-9))


def test_recorded_single_step_matches_profiler_phase_order(tmp_path):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = Net()
    step = _train_step(net, _batch(8, 0), make_optimizer("sgd", net.parameters(), lr=0.01))
    rank, _ = record_step(step, list(net.parameters()), steps=1)
    phases = [e.phase for e in rank.events if e.phase in ("forward", "backward", "optimizer")]
    collapsed = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
    timeline = trace.record(step, steps=1, warmup=0)
    spans = sorted((s for s in timeline.spans if s.row == "main" and s.depth == 0), key=lambda s: s.start_us)
    profiled = [s.name for s in spans if s.name in ("forward", "backward", "optimizer")]
    assert collapsed == profiled == ["forward", "backward", "optimizer"]
    convs = [e for e in rank.events if e.name.startswith("aten.convolution") and e.phase == "forward"]
    assert [e.flops for e in convs] == [2 * 8 * 10 * 24 * 24 * 25, 2 * 8 * 20 * 8 * 8 * 250]
    assert all(g < len(rank.events) and rank.events[g].phase == "backward" for g in rank.grad_ready)
    rec = Recording([rank], [[n, p.numel(), 4] for n, p in net.named_parameters()], label="single")
    assert Recording.load(rec.save(tmp_path / "r.json")) == rec


@pytest.fixture(scope="module")
def ddp_recording():
    return record_ddp(2, batch=32, bucket_mb=0.02, steps=3, calibrate=True)


def test_ddp_recording_has_one_all_reduce_per_bucket(ddp_recording):
    sizes = [torch.empty(numel, device="meta") for _, numel, _ in ddp_recording.params]
    buckets = assign_buckets(sizes, 0.02)
    assert len(buckets) >= 2
    for rank in ddp_recording.ranks:
        reduces = [(i, e) for i, e in enumerate(rank.events) if e.stream == "comm"]
        assert [e.name for _, e in reduces] == ["all_reduce"] * len(buckets)
        assert [e.bytes for _, e in reduces] == [sum(4 * sizes[p].numel() for p in b) for b in buckets]
        for (i, e), b in zip(reduces, buckets):       # after its bucket's last gradient, before the optimizer
            assert max(rank.grad_ready[p] for p in b) < i and e.phase == "backward" and e.group_size == 2
        first_opt = next(i for i, e in enumerate(rank.events) if e.phase == "optimizer")
        assert all(i < first_opt for i, _ in reduces)
        waited = {d for e in rank.events for d in e.after if rank.events[d].stream == "comm"}
        assert waited == {i for i, _ in reduces}


def test_rebucketing_and_report_cpu_prediction(ddp_recording, capsys):
    h100 = get_profile("h100_node")
    one = replay(ddp_recording, h100, world=64, bucket_mb=100.0)
    many = replay(ddp_recording, h100, world=64, bucket_mb=0.001)
    tiny = assign_buckets([torch.empty(n, device="meta") for _, n, _ in ddp_recording.params], 0.001)
    assert one.collectives == 1 and many.collectives == len(tiny) > 2
    assert many.comm_s > one.comm_s          # α paid once per bucket
    cpu = cpu_this_machine(ddp_recording.allreduce)
    pred = replay(ddp_recording, cpu)
    measured = ddp_recording.measured_step_s
    with capsys.disabled():                  # a report, never an assert: the machine may be busy
        print(f"\n[simulate] 2-rank DDP step of Net (batch 32/rank): predicted {pred.step_s * 1e3:.2f} ms on "
              f"cpu_this_machine ({cpu.source}), measured {measured * 1e3:.2f} ms, "
              f"error {(pred.step_s - measured) / measured:+.0%}")
    assert pred.step_s > 0 and math.isfinite(pred.step_s)


def test_cli_replays_a_cached_recording(ddp_recording, tmp_path, capsys):
    path = ddp_recording.save(tmp_path / "rec.json")
    out = main(["--world", "64", "--profile", "b200_node", "--bucket-mb", "25", "--recording", str(path),
                "--json", "--trace", str(tmp_path / "t.json")])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["world"] == 64
    assert out["collectives"] == 1
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


def test_bad_arguments_name_the_allowed_values():
    with pytest.raises(ValueError, match="h100_node"):
        get_profile("h200_node")
    with pytest.raises(ValueError, match="ddp"):
        check_strategy("pipeline", 8)
    with pytest.raises(ValueError, match="world must be 1"):
        check_strategy("single", 8)
    with pytest.raises(ValueError, match="ring"):
        replay(toy_recording(), TOY, algorithm="mesh")
    with pytest.raises(ValueError, match="all_reduce"):
        collective_seconds("all_gather", 1e6, 8, TOY)
    with pytest.raises(ValueError, match="world"):
        replay(toy_recording(), TOY, world=0)
    with pytest.raises(ValueError, match="eff_flops"):
        replay(toy_recording(), replace(TOY, eff_flops=0))
    with pytest.raises(SystemExit):
        main(["--profile", "dgx_moon"])
