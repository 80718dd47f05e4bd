"""See a cluster from a laptop: record the course's real training step once, replay it on a virtual clock.

    from course_lib.simulate import record_ddp, replay, get_profile, sweep
    rec = record_ddp(world_size=2)                       # BucketedDDP step of Net on 2 gloo ranks
    p = replay(rec, get_profile("h100_node"), world=64)  # the same step on 64 H100s (8 per node)
    print(p.summary()); p.timeline.draw(); p.timeline.save_chrome("traces/sim.json")
    sweep(rec, get_profile("h100_node"), worlds=(1, 8, 64, 512))

- `record`: a TorchDispatchMode that lists each aten op (FLOPs, bytes, phase) and each collective
  (kind, bytes, group) with the dependencies between them; JSON save/load.
- `replay`: compute and comm streams per device; roofline time per op, α–β time per collective.
- `profiles`: H100/A100/B200 nodes, a 25 GbE cloud VM (sourced figures), and this CPU (`cpu_this_machine`,
  then `calibrate` per op kind on one measured step).
- `pipeline`: GPipe and 1F1B replayed from each stage's recorded micro-batch (`record_stages`,
  `replay_pipeline`), and lecture 09's 2-stage step measured against its replay (`compare_measured`).
- `pipeline_clock`: the loop under it: any schedule's per-rank F/B/I/W actions replayed with given times
  (interleaved 1F1B and zero bubble in lecture 09), checked and drawn.
- `shapes`: GPT-2 small recorded by shape on the meta device (no weights, no arithmetic).
- `transformer`: the course's ViT step recorded on real tensors, its tensor-parallel step on gloo ranks (the TP
  all-reduces as recorded collectives), one TP rank's block at any size (real, or by shape on the meta device).
- `layout_memory`, `layouts`: dp x tp x pp layouts of that transformer (ViT, GPT-2-like, 7B-like): memory per GPU
  per term, step time on the virtual clock, MFU, whether it fits (`layout_report`, `sweep_layouts`, `layout_widget`).
Command line: `python -m course_lib.simulate --strategy ddp --world 64 --profile h100_node` (`--model gpt2`:
GPT-2 small by shape instead of the course's own step).
"""
from .layouts import FACTS, LayoutReport, ModelFacts, layout_report, layout_widget, sweep_layouts
from .pipeline import RecordedPipeline, compare_measured, record_stages, replay_pipeline
from .profiles import PROFILES, Link, Profile, calibrate, cpu_this_machine, get_profile
from .record import Event, RankTrace, Recording, record_ddp, record_fsdp, record_single
from .replay import Prediction, collective_seconds, rebucket, replay, sweep

__all__ = ["PROFILES", "Link", "Profile", "calibrate", "cpu_this_machine", "get_profile", "Event", "RankTrace", "Recording",
           "record_ddp", "record_fsdp", "record_single", "RecordedPipeline", "compare_measured",
           "record_stages", "replay_pipeline", "Prediction", "collective_seconds", "rebucket", "replay", "sweep",
           "FACTS", "LayoutReport", "ModelFacts", "layout_report", "layout_widget", "sweep_layouts"]
