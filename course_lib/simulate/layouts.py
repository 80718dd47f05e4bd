"""3-D layouts (dp x tp x pp) of the course's transformer on a modelled cluster: memory per GPU, step time, MFU.

`layout_report(facts, dp, tp, pp, profile, micro_batches=8, zero=1)` answers "does it fit, and how fast?":

- memory per GPU of the first pipeline stage, per term (`layout_memory`: ZeRO's 2+2+12 bytes per parameter,
  Korthikanti et al. 2022's activations with the TP/SP/PP splits), against the GPU's memory (hardware.CHIPS);
- the step on the virtual clock: per block and micro-batch, one tensor-parallel rank's forward and backward
  (`transformer.record_rank_block`, each op at its roofline time on the profile) plus the TP collectives
  (2 per block each way, [b,s,h] each: `tensor_parallel_block.block_communication`, the count the real TP
  recording of the ViT shows) inside the node; the pp stages replayed as 1F1B (or GPipe) with those times and
  the activations sent between stages (`pipeline_clock.replay_actions`: the bubble (pp-1)/(m+pp-1) appears by
  itself); then the data-parallel gradient all-reduce (ZeRO-1/2: reduce-scatter + all-gather, the same bytes)
  across the dp ranks, which share the node's network cards with the other tp-1 TP groups; the optimizer
  (memory-bound: 28 bytes per updated parameter). ZeRO-3 (FSDP) instead all-gathers the stage's parameters
  twice and reduce-scatters its gradients per micro-batch, hidden behind compute (prefetch) where it fits.
- MFU: the recorded block FLOPs (no recomputation) / (step x the profile's peak).

Assumptions, beyond the profile's: TP and DP communication is not overlapped with compute (Megatron-LM can
overlap the gradient reduction: an option it has); the embeddings and the output layer are left out of the time;
the ranks are placed tp innermost, then dp, then pp (Megatron-LM's order).

Which figures come from where (`LayoutReport.sources`): FACTS["vit"] is the course's ViT, its block recorded
on real tensors; "gpt2-like" and "7b-like" are the same block at GPT-2 small's and a 7B model's shape,
recorded on the meta device (scaled by shape: nothing ran). The TP collectives of the real ViT are recorded
(`transformer.record_vit_tp`, compared in tests/test_simulate_layouts.py); memory is by formula.

Context parallelism (cp, `distributed.context_parallel`'s ring attention) would split the sequence once more:
activations / cp, plus cp-1 ring steps per attention passing K and V (2·b·(s/cp)·h/tp numbers each way),
overlapped with the attention blocks. Expert parallelism (ep, `distributed.moe`) applies only to MoE layers: two
all-to-alls of the routed tokens per MoE layer and pass, experts' weights / ep. The dense ViT has neither.

    from course_lib.simulate.layouts import FACTS, layout_report, sweep_layouts
    r = layout_report(FACTS["7b-like"], dp=8, tp=8, pp=1, profile=get_profile("h100_node"), micro_batches=8)
    print(r.text())
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

from ..distributed import schedules_zb as zb
from ..distributed.network import collective_seconds
from ..hardware import CHIPS
from ..validate import boolean, int_in_range, one_of, positive_int
from .layout_memory import RECOMPUTE, TERMS, block_params, check_layout, layout_memory
from .pipeline_clock import replay_actions
from .profiles import Profile, check_profile, get_profile
from .transformer import record_rank_block


class ModelFacts(NamedTuple):
    """A transformer built from the course's block: its shape and where its per-block costs come from."""

    name: str
    layers: int
    hidden: int
    heads: int
    seq: int
    mlp_ratio: int = 4
    other_params: int = 0      # outside the blocks (embeddings, head): on the first stage, whole on each tp rank
    real: bool = False         # True: blocks recorded on real tensors (fp32); False: by shape (bf16, meta)
    source: str = ""

    def params(self) -> int:
        split, whole = block_params(self.hidden, self.mlp_ratio)
        return self.layers * (split + whole) + self.other_params


# ViT(): patch embedding 49·64 + 64, positions 16·64, final norm 2·64, head 64·10 + 10 (204,938 in all).
FACTS = {f.name.split(" ")[0]: f for f in (
    ModelFacts("vit (course ViT, recorded)", 4, 64, 4, 16, 4, 49 * 64 + 64 + 16 * 64 + 2 * 64 + 64 * 10 + 10, True,
               "course_lib.vit.ViT(): 7x7 patches -> 16 tokens, dim 64, depth 4, 4 heads"),
    ModelFacts("gpt2-like (scaled by shape)", 12, 768, 12, 1024, 4, 50257 * 768 + 1024 * 768, False,
               "GPT-2 small's shape (Radford et al. 2019; simulate.shapes.GPT2_SMALL) with the ViT's block"),
    ModelFacts("7b-like (scaled by shape)", 32, 4096, 32, 2048, 4, 32000 * 4096, False,
               "LLaMA-7B's 32 layers, width 4,096, 32 heads, 2,048-token context and 32,000-token vocabulary "
               "(Touvron et al. 2023, Table 2 and section 2.1) with the ViT's block (4x GELU MLP, biases; LLaMA's "
               "is SwiGLU), input embedding only"),
)}

_CHIP = {"h100_node": "NVIDIA H100 SXM", "h200_node": "NVIDIA H200 SXM", "b200_node": "NVIDIA B200 (HGX)"}
# a100_node: A100 80GB SXM; cloud_vm_25gbe: A100 40GB (NVIDIA A100 datasheet, 2021, as profiles.py says)
MEMORY_GB = {**{p: next(c.memory_gb for c in CHIPS if c.name == n) for p, n in _CHIP.items()},
             "a100_node": 80.0, "cloud_vm_25gbe": 40.0}
ADAM_BYTES_MOVED = 28      # per updated parameter: read fp32 master, m, v + bf16 grad (14); write them + bf16 param


@dataclass
class LayoutReport:
    facts: ModelFacts
    dp: int
    tp: int
    pp: int
    micro_batch: int
    micro_batches: int
    zero: int
    profile: str
    memory: dict               # bytes per GPU per TERMS, + "total"
    capacity: float | None     # bytes of one GPU (None: unknown)
    times: dict                # seconds: compute, tp_comm, pipeline, dp_comm, optimizer, step
    bubble: float              # (pp-1)/(m+pp-1)
    mfu: float
    sources: dict = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.memory["total"] <= self.capacity

    @property
    def too_large(self) -> str | None:
        """The largest term when the layout does not fit, else None."""
        return None if self.fits else max(TERMS, key=lambda t: self.memory[t])

    def summary(self) -> dict:
        return {"layout": f"dp{self.dp} tp{self.tp} pp{self.pp}", "GPUs": self.gpus, "m": self.micro_batches,
                "zero": self.zero, **{f"{t} GB": round(self.memory[t] / 1e9, 2) for t in (*TERMS, "total")},
                "fits": self.fits, "step ms": round(self.times["step"] * 1e3, 2), "bubble": round(self.bubble, 3),
                "MFU": round(self.mfu, 3)}

    def text(self) -> str:
        gb = {t: self.memory[t] / 1e9 for t in (*TERMS, "total")}
        cap = "" if self.capacity is None else f" of {self.capacity / 1e9:.0f} GB"
        verdict = "fits" if self.fits else f"DOES NOT FIT: {self.too_large} is the largest term"
        t = {k: v * 1e3 for k, v in self.times.items()}
        return "\n".join([
            f"{self.facts.name}: dp {self.dp} x tp {self.tp} x pp {self.pp} = {self.gpus} GPUs ({self.profile}), "
            f"ZeRO-{self.zero}, {self.micro_batches} micro-batches of {self.micro_batch} x {self.facts.seq} tokens",
            "memory per GPU (first stage): " + ", ".join(f"{k} {v:.3g} GB" for k, v in gb.items() if k != "total")
            + f"; total {gb['total']:.3g} GB{cap}: {verdict}",
            f"step {t['step']:.3g} ms: pipeline {t['pipeline']:.3g} ms (compute {t['compute']:.3g} ms, TP "
            f"communication {t['tp_comm']:.3g} ms, bubble {100 * self.bubble:.0f}%), data-parallel communication "
            f"{t['dp_comm']:.3g} ms exposed, optimizer {t['optimizer']:.3g} ms; MFU {100 * self.mfu:.1f}%",
            *(f"  {k}: {v}" for k, v in self.sources.items())])


def _block_seconds(facts: ModelFacts, micro_batch: int, tp: int, profile: Profile) -> tuple[float, float, float]:
    """(forward s, backward s, FLOPs) of one tp rank's block for one micro-batch, each op at its roofline time."""
    trace = record_rank_block(facts.hidden, facts.heads, facts.seq, micro_batch, tp, facts.mlp_ratio, facts.real)
    secs = {p: sum(profile.op_seconds(e.flops, e.bytes, e.view, e.name) for e in trace.events if e.phase == p)
            for p in ("forward", "backward")}
    return secs["forward"], secs["backward"], sum(e.flops for e in trace.events)


def _tp_seconds(facts, micro_batch, tp, profile, sequence_parallel, algorithm) -> float:
    """One pass (forward or backward) of one block: 2 all-reduces of [b,s,h] (SP: 2 all-gathers + 2
    reduce-scatters), over tp GPUs of the profile's fabric (NVLink while tp <= GPUs per node)."""
    if tp == 1:
        return 0.0
    nbytes = micro_batch * facts.seq * facts.hidden * (4 if facts.real else 2)
    kinds = ("all_gather", "reduce_scatter") if sequence_parallel else ("all_reduce",)
    return 2 * sum(collective_seconds(k, nbytes, tp, profile.fabric, algorithm) for k in kinds)


def _dp_fabric(profile: Profile, tp: int):
    """The network one data-parallel group sees: tp groups side by side share each node's GPUs and cards."""
    f = profile.fabric
    return replace(f, gpus_per_node=max(f.gpus_per_node // tp, 1), nics_per_node=max(f.nics_per_node // tp, 1))


def layout_report(facts: ModelFacts, dp: int, tp: int, pp: int, profile: Profile | str = "h100_node",
                  micro_batches: int = 8, zero: int = 1, micro_batch: int = 1, gpus: int | None = None,
                  sequence_parallel: bool = True, recompute: str = "none", schedule: str = "1f1b",
                  algorithm: str = "auto") -> LayoutReport:
    """Memory per GPU, step time and MFU of `facts` laid out dp x tp x pp on `profile` (see the module docstring).

    micro_batches: m per step and pipeline, micro_batch sequences each (global batch dp·m·micro_batch);
    zero: ZeRO stage 0..3; gpus: if given, dp·tp·pp must equal it; recompute: layout_memory.RECOMPUTE
    ("full" adds one forward per backward, "selective" the attention core's FLOPs)."""
    if not isinstance(facts, ModelFacts):
        raise TypeError(f"facts must be a ModelFacts (FACTS: {tuple(FACTS)}); got {type(facts).__name__}")
    profile = check_profile(get_profile(profile) if isinstance(profile, str) else profile)
    boolean("sequence_parallel", sequence_parallel)
    check_layout(facts.layers, facts.hidden, facts.heads, facts.seq, dp, tp, pp, sequence_parallel, gpus)
    int_in_range("zero", zero, 0, 3)
    m, b = positive_int("micro_batches", micro_batches), positive_int("micro_batch", micro_batch)
    mem = layout_memory(facts.layers, facts.hidden, facts.heads, facts.seq, b, dp, tp, pp, zero, m,
                        mlp_ratio=facts.mlp_ratio, other_params=facts.other_params,
                        sequence_parallel=sequence_parallel, recompute=recompute, schedule=schedule)
    mem["total"] = sum(mem.values())
    per_stage = facts.layers // pp
    f, bw, flops = _block_seconds(facts, b, tp, profile)
    redo = {"none": 0.0, "full": f,      # selective: QKᵀ and PV again, 4·b·s²·h/tp FLOPs
            "selective": 4 * b * facts.seq ** 2 * facts.hidden / tp / (profile.peak_flops * profile.eff_flops)}
    tp_pass = _tp_seconds(facts, b, tp, profile, sequence_parallel, algorithm)
    t_f, t_b = per_stage * (f + tp_pass), per_stage * (bw + redo[one_of("recompute", recompute, RECOMPUTE)] + tp_pass)
    link = profile.intra if dp * tp * pp <= profile.gpus_per_node else profile.inter
    message = link.alpha + b * facts.seq * facts.hidden * 2 / (tp if sequence_parallel else 1) / (link.GBps * 1e9)
    run = replay_actions(zb.order(schedule, pp, m), lambda a: t_f if a.kind == "F" else t_b,
                         lambda a: message if pp > 1 else 0.0)
    compute = m * per_stage * (f + bw + redo[recompute])
    stage_params = mem["parameters"] / 2 * (dp if zero >= 3 else 1)     # this GPU's parameters before ZeRO-3
    grads, fabric = 2 * stage_params, _dp_fabric(profile, tp)
    if dp == 1:
        dp_comm = 0.0
    elif zero == 3:                      # per micro-batch: all-gather (forward, backward), reduce-scatter
        gathered = m * (2 * collective_seconds("all_gather", grads, dp, fabric, algorithm)
                        + collective_seconds("reduce_scatter", grads, dp, fabric, algorithm))
        dp_comm = max(gathered - compute, 0.0)
    elif zero == 0:
        dp_comm = collective_seconds("all_reduce", grads, dp, fabric, algorithm)
    else:
        dp_comm = sum(collective_seconds(k, grads, dp, fabric, algorithm) for k in ("reduce_scatter", "all_gather"))
    updated = stage_params / (dp if zero >= 1 else 1)
    optimizer = updated * ADAM_BYTES_MOVED / (profile.mem_GBps * 1e9 * profile.eff_bw)
    step = run.step + dp_comm + optimizer
    times = {"compute": compute, "tp_comm": 2 * m * per_stage * tp_pass, "pipeline": run.step, "dp_comm": dp_comm,
             "optimizer": optimizer, "step": step}
    how = "on real tensors (fp32, the CPU)" if facts.real else "by shape on the meta device (bf16): scaled, not run"
    sources = {"model": facts.source,
               "compute": f"one tp rank's block recorded {how}; each op at its roofline time on {profile.name}",
               "TP collectives": "2 per block and pass of [b,s,h] (block_communication; the real ViT's recorded "
                                 "TP step has exactly these)",
               "memory": "formulas: ZeRO's 2+2+12 bytes per parameter (Rajbhandari et al. 2020), activations "
                         "Korthikanti et al. 2022 Table 2",
               "network": profile.source}
    capacity = MEMORY_GB.get(profile.name)
    return LayoutReport(facts, dp, tp, pp, b, m, zero, profile.name, mem,
                        None if capacity is None else capacity * 1e9, times, (pp - 1) / (m + pp - 1),
                        m * per_stage * flops / (step * profile.peak_flops), sources)


def layouts_for(facts: ModelFacts, gpus: int, max_tp: int = 8) -> list[tuple[int, int, int]]:
    """Every (dp, tp, pp) with dp·tp·pp = gpus that check_layout accepts, tp <= max_tp (inside one node)."""
    out = []
    for tp in range(1, min(positive_int("max_tp", max_tp), positive_int("gpus", gpus)) + 1):
        for pp in range(1, gpus // tp + 1):
            if gpus % (tp * pp) == 0:
                try:
                    check_layout(facts.layers, facts.hidden, facts.heads, facts.seq, gpus // (tp * pp), tp, pp)
                except ValueError:
                    continue
                out.append((gpus // (tp * pp), tp, pp))
    return out


def sweep_layouts(facts: ModelFacts, gpus: int, profile: Profile | str = "h100_node", global_batch: int = 512,
                  micro_batch: int = 1, zero: int = 1, **kwargs) -> list[LayoutReport]:
    """layout_report for every layout of `gpus` GPUs at the same global batch (m = global_batch / (dp·micro_batch);
    layouts it does not divide are skipped), fastest first."""
    positive_int("global_batch", global_batch)
    reports = [layout_report(facts, dp, tp, pp, profile, global_batch // (dp * micro_batch), zero, micro_batch,
                             gpus, **kwargs)
               for dp, tp, pp in layouts_for(facts, gpus) if global_batch % (dp * micro_batch) == 0]
    return sorted(reports, key=lambda r: (not r.fits, r.times["step"]))


def plot_memory(report: LayoutReport, ax=None):
    """One horizontal bar of GB per GPU, stacked by term, with the GPU's memory as a dashed line."""
    import matplotlib.pyplot as plt

    if ax is None:
        ax = plt.subplots(figsize=(7, 1.8))[1]
    left = 0.0
    for term in TERMS:
        gb = report.memory[term] / 1e9
        ax.barh(0, gb, left=left, label=f"{term} {gb:.3g} GB")
        left += gb
    if report.capacity is not None:
        ax.axvline(report.capacity / 1e9, color="k", ls="--", lw=1, label=f"GPU memory {report.capacity / 1e9:.0f} GB")
    ax.set(yticks=[], xlabel="GB per GPU (first pipeline stage)",
           title=f"{report.facts.name.split(' ')[0]}: dp {report.dp} x tp {report.tp} x pp {report.pp}, "
                 f"ZeRO-{report.zero}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return ax


def show_layout(model: str = "7b-like", dp: int = 8, tp: int = 8, pp: int = 1, zero: int = 1, micro_batches: int = 8,
                micro_batch: int = 1, profile: str = "h100_node", plot: bool = True) -> LayoutReport | None:
    """What the widget calls: print layout_report(FACTS[model], ...)'s text and draw its memory bar; returns the
    report, or prints why the layout cannot be built (a widget must not raise) and returns None."""
    try:
        report = layout_report(FACTS[one_of("model", model, tuple(FACTS))], dp, tp, pp, profile, micro_batches, zero,
                               micro_batch)
    except ValueError as e:
        print(f"not a layout: {e}")
        return None
    print(report.text())
    if plot:
        import matplotlib.pyplot as plt
        plot_memory(report)
        plt.show()
    return report


def _front_end() -> bool:
    """True inside a Jupyter kernel (widgets can render); False in plain Python, pytest or a script."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def layout_widget(model: str = "7b-like", dp: int = 8, tp: int = 8, pp: int = 1, zero: int = 1,
                  micro_batches: int = 8, profile: str = "h100_node"):
    """Dropdowns for the model, dp, tp, pp and ZeRO stage and a micro-batch slider over `show_layout`, in Jupyter
    (show.interactive: a published page shows the starting values). Without a front end: show_layout's report."""
    if not _front_end():
        return show_layout(model, dp, tp, pp, zero, micro_batches, profile=profile, plot=False)
    import ipywidgets as widgets

    from ..show import interactive
    powers = [2 ** i for i in range(10)]
    return interactive(lambda **kw: show_layout(profile=profile, **kw) and None,
                       model=widgets.Dropdown(options=list(FACTS), value=model, description="model"),
                       dp=widgets.Dropdown(options=powers, value=dp, description="dp"),
                       tp=widgets.Dropdown(options=[1, 2, 4, 8], value=tp, description="tp"),
                       pp=widgets.Dropdown(options=powers[:7], value=pp, description="pp"),
                       zero=widgets.Dropdown(options=[0, 1, 2, 3], value=zero, description="ZeRO"),
                       micro_batches=widgets.IntSlider(value=micro_batches, min=1, max=64, description="m"))
