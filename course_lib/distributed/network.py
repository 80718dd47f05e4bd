"""One model of the network for every collective time in the course: a cluster's fabric and NCCL's algorithms on it.

A node holds `gpus_per_node` GPUs joined by NVLink (`intra`: α s per message, GB/s per direction PER GPU) and
`nics_per_node` network cards (`inter`: α s, GB/s per direction of ONE card). NCCL does not run one ring at
one card's speed: it runs one ring (a "channel") per card, each carrying its share of the data through its own
card, so across nodes a GPU's rings move data at B_x = min(B_nv, cards x B_card). For an all-reduce of S bytes
per GPU on p GPUs, g = min(p, gpus_per_node) GPUs per node, m = ceil(p / g) nodes:

    algorithm        latency term                          bandwidth term
    (one node)       2(p-1)·α_nv                           2(p-1)/p·S / B_nv     every algorithm: NVLink only
    "ring"           2(p-m)·α_nv + 2(m-1)·α_net            2(p-1)/p·S / B_x
    "tree"           2(g-1)·α_nv + 2⌈log2 m⌉·α_net         2·S / B_x
    "auto"           the faster of ring and tree, as NCCL's tuner picks for each call
    "hierarchical"   2(g-1)·α_nv + 2(m-1)·α_net            2(g-1)/g·S / B_nv + 2(m-1)/m·S / (cards·B_card)
    ONE_CARD         2(p-1)·α_net                          2(p-1)/p·S / B_card   THE MISTAKE: one ring, one card

Ring and tree are NCCL's own cost model (NVIDIA/nccl, src/graph/tuning.cc, `ncclTopoTuneModel`): a ring
all-reduce takes 2(p-1) steps of which 2(m-1) cross the network, and its algorithm bandwidth is the bus
bandwidth x p / (2(p-1)); a tree takes 2((g-1)·intra + log2(m)·inter) and its algorithm bandwidth is half the
bus bandwidth: each node sends and receives about 2·S, a little more than the ring's 2(p-1)/p·S, so large
messages prefer the ring and many nodes the tree. Left out: NCCL's empirical corrections (protocols, per-channel
caps, tree bandwidth x0.9). The tree is NCCL's pipelined double binary tree across nodes and a chain inside each
node (Jeaugey, "Massively Scale Your Deep Learning Training with NCCL 2.4", NVIDIA blog, 2019: "full bandwidth"
with logarithmic latency); inside one node the model uses the ring. "hierarchical" is Horovod's: reduce-scatter
inside the node, an all-reduce of the S/g shard across nodes (g at once, sharing the node's cards), all-gather
inside, one after another. All-gather and reduce-scatter of a whole tensor S are half an all-reduce (NCCL runs
them as rings only: "tree" and "auto" mean the ring there).

    from course_lib.distributed.network import FABRICS, allreduce_seconds
    allreduce_seconds(100e6, 16, FABRICS["DGX H100"], "ring")     # 100 MB on 2 nodes of 8 H100s
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..validate import number_in_range, one_of, positive_int, positive_number
from . import costmodel

ALGORITHMS = ("auto", "ring", "tree", "hierarchical")
ONE_CARD = "one_card_ring"          # the mistake, kept by name so a lecture can show why it is wrong
KINDS = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True)
class Link:
    """α: seconds per message; GBps: GB/s (1e9 B/s) per direction, per GPU (NVLink) or per card (network)."""

    alpha: float
    GBps: float

    def __post_init__(self):
        number_in_range("alpha", self.alpha, 0, hint=" (seconds)")
        positive_number("GBps", self.GBps, finite=False, hint=" (GB/s per direction; math.inf: a free link)")

    @property
    def beta(self) -> float:
        """Seconds per byte."""
        return 1.0 / (self.GBps * 1e9)


# NVLink per GPU, GB/s: (both directions together, as datasheets quote it; ONE direction). A ring sends and
# receives at once, so the model uses one direction. Sources: NVIDIA Tesla V100 datasheet (2017), A100 datasheet
# (2020), H100 Tensor Core GPU datasheet (2022), DGX B200 / Blackwell datasheet (2024).
NVLINK_GENERATIONS = {"NVLink2 (V100)": (300.0, 150.0), "NVLink3 (A100)": (600.0, 300.0),
                      "NVLink4 (H100)": (900.0, 450.0), "NVLink5 (B200)": (1800.0, 900.0)}
# GPUs that reach each other over NVLink (an NVLink "domain"): 8 on an HGX/DGX node, 72 in a GB200 NVL72 rack
# (NVIDIA GB200 NVL72 datasheet, 2024). Beyond it a collective crosses the network cards.
NVLINK_DOMAIN = {"HGX node": 8, "GB200 NVL72": 72}
# The links, GB/s per direction: NVLink per GPU (above); network cards: InfiniBand HDR 200 Gb/s = 25 GB/s and
# NDR 400 Gb/s = 50 GB/s each way (ConnectX-6/-7), Ethernet 25 and 10 Gb/s. The α values are assumptions of the
# size NCCL's own model uses (tuning.cc, Simple protocol: 3.4 µs per NVLink ring step, 9.6 µs per network step);
# Ethernet with TCP sockets pays more.
LINKS = {"NVLink3 (A100)": Link(5e-6, NVLINK_GENERATIONS["NVLink3 (A100)"][1]),
         "NVLink4 (H100)": Link(5e-6, NVLINK_GENERATIONS["NVLink4 (H100)"][1]),
         "NVLink5 (B200)": Link(5e-6, NVLINK_GENERATIONS["NVLink5 (B200)"][1]),
         "InfiniBand HDR": Link(10e-6, 200 / 8), "InfiniBand NDR": Link(10e-6, 400 / 8),
         "25 GbE": Link(50e-6, 25 / 8), "10 GbE": Link(50e-6, 10 / 8)}


@dataclass(frozen=True)
class Fabric:
    """A cluster's network: nodes of `gpus_per_node` GPUs joined by `intra` (NVLink, per GPU), each node with
    `nics_per_node` network cards of `inter` (per card). Ask "what if?" on a copy:
    `dataclasses.replace(FABRICS["DGX H100"], nics_per_node=1)` is the same cluster with one card per node."""

    name: str
    gpus_per_node: int
    intra: Link
    nics_per_node: int
    inter: Link
    source: str = ""

    def __post_init__(self):
        positive_int("fabric.gpus_per_node", self.gpus_per_node)
        positive_int("fabric.nics_per_node", self.nics_per_node)
        for name in ("intra", "inter"):
            if not isinstance(getattr(self, name), Link):
                raise TypeError(f"fabric.{name} must be a network.Link; got {type(getattr(self, name)).__name__}")

    @property
    def cross_GBps(self) -> float:
        """B_x: GB/s per direction of a GPU's rings across nodes: the node's cards together (one ring per card),
        at most the GPU's NVLink (a ring runs at its slowest hop; one GPU per node passes no NVLink)."""
        cards = self.nics_per_node * self.inter.GBps
        return cards if self.gpus_per_node == 1 else min(self.intra.GBps, cards)


_CX7 = "8 single-port ConnectX-7 cards up to 400 Gb/s (NVIDIA DGX BasePOD reference architecture)"
FABRICS = {f.name: f for f in (
    Fabric("DGX A100", NVLINK_DOMAIN["HGX node"], LINKS["NVLink3 (A100)"], 8, LINKS["InfiniBand HDR"],
           "NVIDIA DGX A100 datasheet (2020): 8 x A100 on NVLink3, 8 x 200 Gb/s HDR InfiniBand"),
    Fabric("DGX H100", NVLINK_DOMAIN["HGX node"], LINKS["NVLink4 (H100)"], 8, LINKS["InfiniBand NDR"],
           f"NVIDIA DGX H100 datasheet (2023): 8 x H100 on NVLink4, {_CX7}; DGX H200 the same"),
    Fabric("DGX B200", NVLINK_DOMAIN["HGX node"], LINKS["NVLink5 (B200)"], 8, LINKS["InfiniBand NDR"],
           f"NVIDIA DGX B200 datasheet (2024): 8 x B200 on NVLink5, {_CX7}"),
    Fabric("GB200 NVL72", NVLINK_DOMAIN["GB200 NVL72"], LINKS["NVLink5 (B200)"], 72, LINKS["InfiniBand NDR"],
           "72 GPUs on NVLink5 (GB200 NVL72 datasheet, 2024); 4 OSFP InfiniBand ports per 4-GPU compute tray "
           "(NVIDIA Mission Control, DGX GB200 network deployment guide), taken at NDR 400 Gb/s (assumed rate)"),
    Fabric("cloud VMs, 25 GbE", 1, LINKS["25 GbE"], 1, LINKS["25 GbE"],
           "one GPU per VM, one 25 Gb/s Ethernet port (the VM's stated 'up to' rate); no NVLink to pass"),
)}

# Published nccl-tests all_reduce_perf bus bandwidths (GB/s), each with the system it ran on as a Fabric, to set
# beside `busbw_GBps` (`nccl_tests_vs_model`). n_gpus / nbytes None: the source does not say.
NCCL_TESTS = (
    {"system": "5 nodes x 8 H100, 4 x 400 Gb/s RoCE cards each", "n_gpus": 40, "nbytes": 2**30, "algorithm": "ring",
     "fabric": replace(FABRICS["DGX H100"], name="H100 nodes, 4 cards", nics_per_node=4, source="8 H100 on NVLink4 "
                       "and 4 x 400 Gb/s RoCE cards per node, taken at NDR's rate and α"), "busbw_GBps": 190.0,
     "source": "https://github.com/NVIDIA/nccl/issues/1368 (2024-07-18): all_reduce_perf -b 1M -e 1G -g 1 with "
               "NCCL_ALGO=Ring on 40 ranks; the issue states ring 190 GB/s (tree 150 GB/s) bus bandwidth"},
    {"system": "DGX A100 nodes, 8 x 200 Gb/s HDR cards each", "n_gpus": None, "nbytes": None, "algorithm": "ring",
     "fabric": FABRICS["DGX A100"], "busbw_GBps": 192.0,
     "source": "https://github.com/NVIDIA/nccl/issues/812 (2023-03-31), an NCCL developer: 'On an Nvidia "
               "DGX-A100 system we have 8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW'"},
)
# Illustrative models: (parameters, assumed compute seconds per training step on one GPU).
EXAMPLE_MODELS = {"Net": (21_840, 0.001), "LeNet-5": (431_080, 0.002),
                  "ResNet-50": (25_600_000, 0.1), "1B-param": (1_000_000_000, 1.0)}


def get_fabric(fabric) -> Fabric:
    """`fabric` itself, or FABRICS[fabric] for a name; else a ValueError naming the choices."""
    if isinstance(fabric, Fabric):
        return fabric
    return FABRICS[one_of("fabric", fabric, tuple(FABRICS), hint=" (or a network.Fabric)")]


def allreduce_terms(nbytes, n_gpus: int, fabric, algorithm: str = "auto") -> tuple:
    """(latency s, bandwidth s) of one all-reduce of `nbytes` per GPU (a number or an array) on `n_gpus` GPUs of
    `fabric` (a Fabric or a FABRICS name) with `algorithm` (ALGORITHMS or ONE_CARD): the module docstring's table."""
    one_of("algorithm", algorithm, ALGORITHMS + (ONE_CARD,))
    p, f = positive_int("n_gpus", n_gpus), get_fabric(fabric)
    g = min(f.gpus_per_node, p)
    m = math.ceil(p / g)
    nv, net = f.intra, f.inter
    if m == 1:                                   # one node: NCCL's ring over NVLink
        return costmodel.allreduce_terms("ring", nbytes, p, nv.alpha, nv.beta)
    if algorithm == ONE_CARD:                    # every step at the network's α, every byte through one card
        return costmodel.allreduce_terms("ring", nbytes, p, net.alpha, net.beta)
    if algorithm == "hierarchical":              # in-node ring all-reduce = reduce-scatter + all-gather
        node = costmodel.allreduce_terms("ring", nbytes, g, nv.alpha, nv.beta)
        # the S/g shard at cards·B_card/g per GPU costs what S costs at cards·B_card
        across = costmodel.allreduce_terms("ring", nbytes, m, net.alpha, 1 / (f.nics_per_node * f.inter.GBps * 1e9))
        return node[0] + across[0], node[1] + across[1]
    beta_x = 1 / (f.cross_GBps * 1e9)
    ring_bw = costmodel.allreduce_terms("ring", nbytes, p, 0.0, beta_x)[1]
    ring = (2 * (p - m) * nv.alpha + 2 * (m - 1) * net.alpha, ring_bw)
    tree = (2 * (g - 1) * nv.alpha + costmodel.allreduce_terms("tree", 0, m, net.alpha, 0.0)[0],
            ring_bw * p / (p - 1))               # 2·S·β_x: NCCL's algbw = busbw / 2
    if algorithm != "auto":
        return ring if algorithm == "ring" else tree
    ring_faster = ring[0] + ring[1] <= tree[0] + tree[1]
    return tuple(np.where(ring_faster, r, t) if np.ndim(ring_faster) else (r if ring_faster else t)
                 for r, t in zip(ring, tree))


def allreduce_seconds(nbytes, n_gpus: int, fabric, algorithm: str = "auto"):
    """Seconds of one all-reduce of `nbytes` per GPU on `n_gpus` GPUs of `fabric`: latency + bandwidth term."""
    latency, bandwidth = allreduce_terms(nbytes, n_gpus, fabric, algorithm)
    return latency + bandwidth


def collective_seconds(kind: str, nbytes, n_gpus: int, fabric, algorithm: str = "auto"):
    """Seconds of one `kind` (KINDS) over the whole tensor of `nbytes`: all-gather and reduce-scatter are half an
    all-reduce, as rings (NCCL has no tree for them)."""
    one_of("collective kind", kind, KINDS, hint=" (broadcast and point-to-point are not modelled)")
    if kind == "all_reduce":
        return allreduce_seconds(nbytes, n_gpus, fabric, algorithm)
    one_of("algorithm", algorithm, ALGORITHMS + (ONE_CARD,))
    return allreduce_seconds(nbytes, n_gpus, fabric, "ring" if algorithm in ("auto", "tree") else algorithm) / 2


def busbw_GBps(nbytes, n_gpus: int, fabric, algorithm: str = "auto"):
    """The bus bandwidth nccl-tests would print for this all-reduce (costmodel.busbw of the predicted time)."""
    return costmodel.busbw(nbytes, allreduce_seconds(nbytes, n_gpus, fabric, algorithm), n_gpus)


def scaling_efficiency(parameters: int, bytes_per_param: float, step_compute_s: float, n_gpus: int, fabric,
                       algorithm: str = "auto", overlap: float = 0.0) -> float:
    """Expected data-parallel scaling efficiency: compute / (compute + exposed all-reduce time), 1.0 = perfect.

    Each step computes for `step_compute_s` (per GPU, weak scaling), then all-reduces the gradients (parameters x
    bytes_per_param bytes) on `n_gpus` GPUs of `fabric` with `algorithm`. `overlap` in [0, 1]: the share of the
    all-reduce hidden behind backward (DDP's buckets), never more than the compute itself.
    """
    positive_int("parameters", parameters)
    positive_number("bytes_per_param", bytes_per_param)
    positive_number("step_compute_s", step_compute_s)
    number_in_range("overlap", overlap, 0, 1)
    comm = allreduce_seconds(parameters * bytes_per_param, n_gpus, fabric, algorithm)
    exposed = comm - min(overlap * comm, step_compute_s)
    return step_compute_s / (step_compute_s + exposed)


def what_if_table(models: dict | None = None, fabrics: dict | None = None, n_gpus: int = 16, algorithm: str = "auto",
                  bytes_per_param: float = 4, overlap: float = 0.0) -> list[dict]:
    """Rows (model, fabric, GB/s per GPU, gradient MB, all-reduce ms, efficiency) for each model x fabric.

    models: name -> (parameters, step_compute_s); fabrics: name -> Fabric. Defaults: EXAMPLE_MODELS (rough,
    illustrative) and FABRICS. "GB/s per GPU" is NVLink's inside one node, else the rings' B_x across nodes.
    """
    positive_int("n_gpus", n_gpus)
    rows = []
    for model, (params, compute) in (models or EXAMPLE_MODELS).items():
        for name, fabric in (fabrics or FABRICS).items():
            nodes = math.ceil(n_gpus / fabric.gpus_per_node)
            comm = allreduce_seconds(params * bytes_per_param, n_gpus, fabric, algorithm)
            eff = scaling_efficiency(params, bytes_per_param, compute, n_gpus, fabric, algorithm, overlap)
            rows.append({"model": model, "fabric": name, "GPUs": n_gpus, "nodes": nodes,
                         "GB/s per GPU": fabric.intra.GBps if nodes == 1 else fabric.cross_GBps,
                         "grad MB": round(params * bytes_per_param / 1e6, 2), "compute ms": round(compute * 1e3, 1),
                         "all-reduce ms": round(comm * 1e3, 3), "efficiency": round(eff, 3)})
    return rows


def nccl_tests_vs_model() -> list[dict]:
    """Each NCCL_TESTS figure beside the model's bus bandwidth for its system, GPUs, size and algorithm (where the
    source gives no GPU count or size: B_x, the limit for large messages) and beside the one-card mistake's."""
    rows = []
    for t in NCCL_TESTS:
        f = t["fabric"]
        if t["n_gpus"] is None:
            model, mistake = f.cross_GBps, f.inter.GBps
        else:
            model, mistake = (float(busbw_GBps(t["nbytes"], t["n_gpus"], f, a)) for a in (t["algorithm"], ONE_CARD))
        size = f"{t['nbytes'] / 2**30:g} GiB" if t["nbytes"] else "large"
        rows.append({"system": t["system"], "GPUs": t["n_gpus"] or "?", "size": size,
                     "measured busbw GB/s": t["busbw_GBps"], "model GB/s": round(model, 1),
                     "one-card model GB/s": round(mistake, 1), "source": t["source"]})
    return rows


def plot_algorithms(fabric, nbytes: float, gpus, what: str = "busbw", ax=None):
    """One all-reduce of `nbytes` per GPU against the number of GPUs (each >= 2) on `fabric`: the bus bandwidth
    nccl-tests would print (what="busbw") or its seconds (what="seconds"), for ring, hierarchical, tree and the
    one-card mistake; a dotted line where one node ends."""
    import matplotlib.pyplot as plt

    one_of("what", what, ("busbw", "seconds"))
    f = get_fabric(fabric)
    gpus = [positive_int("gpus[i]", g) for g in gpus]
    if ax is None:
        ax = plt.subplots(figsize=(6, 4))[1]
    styles = {"ring": "o-", "hierarchical": "s-", "tree": "^-", ONE_CARD: "k--"}
    for algorithm, style in styles.items():
        y = [busbw_GBps(nbytes, g, f, algorithm) if what == "busbw" else allreduce_seconds(nbytes, g, f, algorithm)
             for g in gpus]
        label = "one ring at one card's speed (the mistake)" if algorithm == ONE_CARD else algorithm
        (ax.semilogx if what == "busbw" else ax.loglog)(gpus, y, style, label=label)
    ax.axvline(f.gpus_per_node, color="gray", ls=":", lw=1)
    size = f"{nbytes / 1e9:g} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:g} MB"
    ax.set(xlabel="GPUs", ylabel="bus bandwidth GB/s" if what == "busbw" else "seconds per all-reduce",
           title=f"{size} all-reduce on {f.name}")
    ax.legend(fontsize=7)
    return ax
