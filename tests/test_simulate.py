"""course_lib.simulate: record the course's step, replay it on a virtual clock, against hand formulas."""
import json
import math
from dataclasses import replace

import pytest
import torch

from course_lib import recorded, trace
from course_lib.distributed.costmodel import allreduce_time, ring_time
from course_lib.distributed.ddp import assign_buckets
from course_lib.loop import make_optimizer
from course_lib.models import Net
from course_lib.simulate import (
    Event,
    Link,
    Profile,
    RankTrace,
    Recording,
    calibrate,
    collective_seconds,
    cpu_this_machine,
    get_profile,
    record_ddp,
    record_single,
    replay,
)
from course_lib.simulate.__main__ import check_strategy, main
from course_lib.simulate.profiles import gpu_host_seconds
from course_lib.simulate.record import _batch, _train_step, record_step

TOY = Profile("toy", peak_flops=1e12, mem_GBps=100.0, gpus_per_node=8, intra=Link(1e-5, 10.0),
              inter=Link(1e-4, 1.0), eff_flops=0.5, eff_bw=0.5, host_s=2e-6)


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


def test_larger_world_follows_the_network_model():
    rec = toy_recording()
    comm = {w: replay(rec, TOY, world=w).comm_s for w in (1, 2, 4, 8, 64)}
    assert comm[1] == 0.0
    for w in (2, 4, 8):   # one node: a ring over NVLink-ish
        assert comm[w] == pytest.approx(ring_time(4e6, w, 1e-5, 1e-10), rel=1e-12)
    # 8 nodes of 8, one card per GPU (nics_per_node None): each GPU's rings cross at min(10, 8 x 1) = 8 GB/s
    ring = 2 * (64 - 8) * 1e-5 + 2 * (8 - 1) * 1e-4 + 2 * 63 / 64 * 4e6 / 8e9
    tree = 2 * 7 * 1e-5 + 2 * 3 * 1e-4 + 2 * 4e6 / 8e9
    assert comm[64] == pytest.approx(min(ring, tree), rel=1e-12)                      # "auto": NCCL's pick
    assert collective_seconds("all_reduce", 4e6, 64, TOY, "ring") == pytest.approx(ring, rel=1e-12)
    hier = ring_time(4e6, 8, 1e-5, 1e-10) + ring_time(4e6 / 8, 8, 1e-4, 1e-9)        # 8 nodes of 8
    assert collective_seconds("all_reduce", 4e6, 64, TOY, "hierarchical") == pytest.approx(hier, rel=1e-12)
    assert comm[1] < comm[2] < comm[4] < comm[8] < comm[64]
    mistake = collective_seconds("all_reduce", 4e6, 64, TOY, "one_card_ring")
    assert mistake == pytest.approx(allreduce_time("ring", 4e6, 64, 1e-4, 1e-9))     # one ring at one card's speed
    assert replay(rec, TOY, world=64, algorithm="one_card_ring").comm_s == pytest.approx(mistake, rel=1e-12)


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


@pytest.mark.slow
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
    local = ddp_recording.local_recording()  # each rank's step without DDP, timed while both ran
    assert local.world_size == 1 and all(e.stream == "compute" for e in local.ranks[0].events)
    cpu = calibrate(cpu_this_machine(ddp_recording.allreduce), local)
    pred = replay(ddp_recording, cpu)
    measured = ddp_recording.measured_step_s
    with capsys.disabled():                  # a report, never an assert: the machine may be busy
        print(f"\n[simulate] 2-rank DDP step of Net (batch 32/rank): predicted {pred.step_s * 1e3:.2f} ms on "
              f"cpu_this_machine ({cpu.source}), measured {measured * 1e3:.2f} ms, "
              f"error {(pred.step_s - measured) / measured:+.0%} (python -m course_lib.bench simulate: the same, "
              "on a quiet machine)")
    assert pred.step_s > 0 and math.isfinite(pred.step_s)


def test_cli_replays_a_cached_recording(ddp_recording, tmp_path, capsys):
    path = ddp_recording.save(tmp_path / "rec.json")
    out = main(["--world", "64", "--profile", "b200_node", "--bucket-mb", "25", "--recording", str(path),
                "--json", "--trace", str(tmp_path / "t.json")])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["world"] == 64
    assert out["collectives"] == 1
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


def test_cli_model_gpt2_records_gpt2_by_shape_whatever_the_strategy(monkeypatch, capsys):
    """--model gpt2 picks the recording (GPT-2 small by shape; a toy here), --strategy how it is replayed."""
    from course_lib.simulate import __main__ as cli

    asked = []
    monkeypatch.setattr(cli, "record_by_shape", lambda shape, batch: asked.append((shape, batch)) or toy_recording(1))
    out = main(["--model", "gpt2", "--world", "8", "--profile", "h100_node"])
    assert asked == [(cli.GPT2_SMALL, 8)] and out["recording"] == "toy" and out["world"] == 8
    assert main(["--model", "gpt2", "--strategy", "single", "--world", "1"])["world"] == 1
    for argv in (["--strategy", "gpt2"], ["--model", "gpt2", "--strategy", "fsdp"]):
        with pytest.raises(SystemExit):
            main(argv)
    assert "--model gpt2" in capsys.readouterr().err and len(asked) == 2


def test_bad_arguments_name_the_allowed_values():
    with pytest.raises(ValueError, match="h100_node"):
        get_profile("h300_node")
    with pytest.raises(ValueError, match="ddp"):
        check_strategy("pipeline", 8)
    with pytest.raises(ValueError, match=r"\('ddp', 'fsdp', 'single'\).*got 'zero3'"):
        check_strategy("zero3", 8)
    with pytest.raises(ValueError, match="gpt2 is a model: --model gpt2"):
        check_strategy("gpt2", 8)
    with pytest.raises(ValueError, match=r"model must be one of \('course', 'gpt2'\); got 'vit'"):
        check_strategy("ddp", 8, model="vit")
    with pytest.raises(ValueError, match="strategy must be 'ddp'.*or 'single'; got 'fsdp'"):
        check_strategy("fsdp", 8, model="gpt2")
    check_strategy("ddp", 64, model="gpt2")
    with pytest.raises(ValueError, match="world must be 1"):
        check_strategy("single", 8)
    with pytest.raises(ValueError, match="hierarchical"):
        replay(toy_recording(), TOY, algorithm="mesh")
    with pytest.raises(ValueError, match="all_reduce"):
        collective_seconds("broadcast", 1e6, 8, TOY)
    with pytest.raises(ValueError, match="world"):
        replay(toy_recording(), TOY, world=0)
    with pytest.raises(ValueError, match="eff_flops"):
        replay(toy_recording(), replace(TOY, eff_flops=0))
    with pytest.raises(SystemExit):
        main(["--profile", "dgx_moon"])


def test_calibrated_cpu_profile_replays_the_measured_single_step():
    torch.set_num_threads(1)
    single = record_single("net", batch=8, steps=1, time_ops=2)
    ops = [e for e in single.ranks[0].events if e.stream == "compute" and not e.view]
    assert all(e.measured_s > 0 for e in ops)
    cpu = replace(TOY, host_s=1e-6, view_s=0.0)
    fitted = calibrate(cpu, single)
    assert replay(single, fitted).step_s == pytest.approx(single.measured_step_s, rel=1e-9)
    assert set(fitted.op_scale) <= {e.name for e in ops} and "aten.convolution" in fitted.op_scale
    shared = calibrate(cpu, single, ranks_per_core=2)            # 4 ranks on 2 cores: every op twice as long
    assert replay(single, shared).step_s == pytest.approx(2 * single.measured_step_s, rel=1e-9)
    with pytest.raises(ValueError, match="time_ops"):
        calibrate(cpu, record_single("net", batch=8, steps=1))
    with pytest.raises(ValueError, match="time_ops"):
        calibrate(cpu, toy_recording())


def test_host_time_adds_on_a_cpu_and_runs_ahead_of_the_kernels_on_a_gpu():
    sync, queued = replace(TOY, host_s=1e-3), replace(TOY, host_s=1e-3, async_launch=True)
    long_op = 1e12       # TOY: 5e11 FLOP/s effective, so 2 s
    assert sync.op_seconds(long_op, 0) == pytest.approx(2.0 + 1e-3)          # a CPU issues, then computes
    assert queued.op_seconds(long_op, 0) == pytest.approx(2.0) and queued.issue_seconds() == 1e-3
    assert queued.op_seconds(10.0, 0, view=True) == queued.issue_seconds(view=True) == 0.0
    assert replace(queued, kernel_min_s=5e-6).op_seconds(10.0, 0) == 5e-6      # no kernel is shorter


def _kernels(*flops):
    return Recording([RankTrace([Event("aten.mm", "forward", flops=f) for f in flops], [])], [], label="kernels")


def test_a_gpu_step_of_tiny_kernels_is_host_bound_and_a_cuda_graph_removes_the_host():
    gpu = replace(TOY, host_s=1e-3, async_launch=True)        # TOY: 5e11 FLOP/s effective
    tiny = _kernels(*[5e5] * 10)                              # 10 kernels of 1 µs, each issued in 1 ms
    p = replay(tiny, gpu)
    assert p.step_s == pytest.approx(10 * 1e-3 + 1e-6) and p.host_s == pytest.approx(1e-2)   # last issue + last kernel
    assert p.compute_s == pytest.approx(1e-5) and p.host_bound and p.exposed_comm_s == 0.0
    graph = replay(tiny, replace(gpu, cuda_graph=True))
    assert graph.step_s == pytest.approx(1e-5) and graph.host_s == 0.0 and not graph.host_bound
    # one long kernel first: the host issues the next ones while it runs, so their host time hides behind it
    mixed = replay(_kernels(1e10, *[5e5] * 3), gpu)           # 20 ms, then three 1 µs kernels issued by 4 ms
    assert mixed.step_s == pytest.approx(1e-3 + 20e-3 + 3e-6) and not mixed.host_bound
    with pytest.raises(ValueError, match="cuda_graph applies to a GPU profile"):
        replay(tiny, replace(TOY, cuda_graph=True))


def test_gpu_profiles_take_their_host_time_from_the_recorded_gpu_step():
    host, source = gpu_host_seconds()
    net = record_single("net", batch=64, steps=1)
    kernels = sum(e.stream == "compute" and not e.view for e in net.ranks[0].events)
    rate = recorded.values("04_single_gpu", "rates")["TensorLoader on device"]
    assert host == pytest.approx(64 / rate / kernels) and "calibrated" in source and "H200" in source
    for name in ("h100_node", "h200_node", "a100_node", "b200_node", "cloud_vm_25gbe"):
        profile = get_profile(name)
        assert profile.host_s == host and profile.async_launch and "host" in profile.source
    assert replay(net, get_profile("h200_node")).step_s == pytest.approx(64 / rate, rel=0.02)   # calibrated on it


def test_a_gpt_shaped_step_records_on_the_meta_device_as_flop_counter_counts_it():
    from torch.utils.flop_counter import FlopCounterMode

    from course_lib.simulate.shapes import GPT, GPTShape, record_by_shape
    tiny = GPTShape("tiny", layers=2, d_model=64, heads=4, seq=32, vocab=100)
    for attention in ("flash", "math"):
        rec = record_by_shape(tiny, batch=2, attention=attention)
        with torch.device("meta"):
            model = GPT(tiny, attention).to(torch.bfloat16)
            idx = torch.randint(0, 100, (2, 32))
        with FlopCounterMode(display=False) as counter:
            torch.nn.functional.cross_entropy(model(idx).view(-1, 100), idx.view(-1)).backward()
        assert rec.flops_per_rank() == counter.get_total_flops() > 6 * 2 * 32 * 2 * 12 * 64 * 64
        assert {e.phase for e in rec.ranks[0].events} >= {"forward", "backward", "optimizer"}
        assert [p[0] for p in rec.params][:2] == ["wte.weight", "wpe.weight"] and rec.params[0][2] == 2
    assert replay(rec, get_profile("h100_node"), world=16).collectives >= 1    # rebucketed: DDP's all-reduces
    with pytest.raises(ValueError, match="flash"):
        record_by_shape(tiny, attention="sparse")
    with pytest.raises(TypeError, match="GPTShape"):
        record_by_shape({"layers": 2})


def test_bench_simulate_reports_the_error_of_each_prediction(ddp_recording, monkeypatch):
    from course_lib.bench import simulate as bench
    monkeypatch.setattr(bench, "record_ddp", lambda world, **kw: ddp_recording)
    monkeypatch.setattr(bench, "compare_measured", lambda *a, **kw: {      # test_simulate_pipeline runs it
        "measured_s": 0.2, "predicted_s": 0.15, "error": -0.25, "measured_bubble": 0.3, "predicted_bubble": 0.2})
    result = bench.run(quick=True)
    assert [r["step"] for r in result.rows][:2] == ["BucketedDDP, Net, 2 gloo ranks", "BucketedDDP, Net, 4 gloo ranks"]
    assert result.rows[2]["error"] == "-25%" and result.summary["pipeline_bubble_measured"] == 0.3
    assert "H200" in result.rows[3]["step"] and result.summary["gpu_host_us_per_kernel"] > 0     # lecture 04, recorded
    assert "CUDA graph" in result.rows[4]["step"] and result.summary["gpu_cuda_graph_ms"] < result.summary["gpu_measured_ms"]
    assert result.summary["gpu_host_bound"] and abs(result.summary["gpu_error"]) < 0.25
    for world in (2, 4):
        s = result.summary
        assert s[f"ddp{world}_error"] == pytest.approx(
            (s[f"ddp{world}_predicted_ms"] - s[f"ddp{world}_measured_ms"]) / s[f"ddp{world}_measured_ms"])


@pytest.mark.slow
def test_fsdp_step_records_gathers_and_scatters_and_replays_them_as_half_rings():
    from course_lib.simulate.record import record_fsdp
    rec = record_fsdp(2, width=64, depth=2, batch=8, steps=1)
    layers = 3                                        # 784-64, 64-64, 64-10: one FSDP unit each
    for rank in rec.ranks:
        comm = [e for e in rank.events if e.stream == "comm"]
        gathers = [e for e in comm if e.name == "all_gather"]
        scatters = [e for e in comm if e.name == "reduce_scatter"]
        assert len(scatters) == layers and layers <= len(gathers) <= 2 * layers
        assert {e.phase for e in scatters} == {"backward"} and gathers[0].phase == "forward"
        whole = sorted(4 * (i * o + o) for i, o in ((784, 64), (64, 64), (64, 10)))
        assert sorted(e.bytes for e in scatters) == whole      # a reduce-scatter's whole input: the full gradient
    assert rec.sharded and rec.measured_step_s > 0
    link = TOY.intra
    assert collective_seconds("all_gather", 8e6, 4, TOY) == pytest.approx(3 * link.alpha + 3 / 4 * 8e6 * link.beta)
    # 2 nodes of 8: 14 NVLink steps and 1 network step, 15/16 of the tensor at min(10, 8 cards x 1) = 8 GB/s
    assert collective_seconds("reduce_scatter", 8e6, 16, TOY) == pytest.approx(14 * 1e-5 + 1e-4 + 15 / 16 * 8e6 / 8e9)
    small, big = (replay(rec, TOY, world=w) for w in (2, 8))
    assert big.comm_s > small.comm_s and big.collectives == small.collectives
    opt = [e for e in rec.ranks[0].events if e.phase == "optimizer" and e.stream == "compute" and not e.view]
    roof = lambda share: sum(TOY.op_seconds(e.flops * share, e.bytes * share) for e in opt)
    assert roof(2 / 8) < roof(1)      # each of 8 ranks updates a quarter of what each of 2 did
