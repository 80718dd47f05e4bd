"""Energy per operation: why fetching a weight from DRAM costs more than computing with it.

Figures (picojoules, 45 nm CMOS at 0.9 V) from M. Horowitz, "Computing's energy problem (and what
we can do about it)", ISSCC 2014, as tabulated for 32-bit operations by S. Han et al., "EIE:
Efficient Inference Engine on Compressed Deep Neural Network" (ISCA 2016, Table I) and "Deep
Compression" (ICLR 2016, Figure 1): int32 add 0.1, fp32 add 0.9, int32 mult 3.1, fp32 mult 3.7,
32-bit SRAM read 5, 32-bit DRAM read 640. The 8- and 16-bit arithmetic figures come from Horowitz's
own chart. The SRAM figure is an 8 KB cache (Horowitz: 10 pJ per 64-bit access, halved for 32
bits); a 1 MB SRAM costs ~10x more. Absolute values shrink with newer processes; the ratios,
DRAM >> SRAM >> arithmetic, hold.

    from course_lib import energy
    energy.ENERGY_PJ["dram_read_32bit"] / energy.ENERGY_PJ["fp32_mult"]   # ~173
    energy.inference_energy_pj(macs=1e6, dram_bytes=4e6)                  # pJ, an Estimate
"""
from __future__ import annotations

from typing import NamedTuple

from .validate import number_in_range, one_of

# picojoules per operation; memory rows per 32-bit word read
ENERGY_PJ = {
    "int8_add": 0.03,
    "int32_add": 0.1,
    "fp16_add": 0.4,
    "fp32_add": 0.9,
    "int8_mult": 0.2,
    "fp16_mult": 1.1,
    "int32_mult": 3.1,
    "fp32_mult": 3.7,
    "sram_read_32bit": 5.0,
    "dram_read_32bit": 640.0,
}
SOURCE = ("Horowitz, ISSCC 2014, 45 nm; 32-bit rows as tabulated by Han et al., EIE (ISCA 2016) "
          "and Deep Compression (ICLR 2016)")

# one multiply-accumulate = one multiply + one add, in a given number format
MAC_PJ = {fmt: ENERGY_PJ[f"{fmt}_mult"] + ENERGY_PJ[f"{fmt}_add"] for fmt in ("int8", "fp16", "int32", "fp32")}


class Estimate(NamedTuple):
    """Energy of one inference in picojoules, split into arithmetic and memory reads."""

    compute_pj: float
    dram_pj: float
    sram_pj: float

    @property
    def total_pj(self) -> float:
        return self.compute_pj + self.dram_pj + self.sram_pj


def fetch_energy_pj(nbytes: float, memory: str = "dram") -> float:
    """Energy to read `nbytes` from "dram" or "sram", at the table's cost per 32-bit word."""
    number_in_range("nbytes", nbytes, 0)
    one_of("memory", memory, ("dram", "sram"))
    return nbytes / 4 * ENERGY_PJ[f"{memory}_read_32bit"]


def inference_energy_pj(macs: float, dram_bytes: float = 0, sram_bytes: float = 0, mac: str = "fp32") -> Estimate:
    """Energy of an inference that does `macs` multiply-accumulates in format `mac` and reads
    `dram_bytes` from DRAM and `sram_bytes` from on-chip SRAM. A model whose weights do not fit
    on chip reads all of them from DRAM on every inference (at batch size 1)."""
    number_in_range("macs", macs, 0)
    one_of("mac", mac, tuple(MAC_PJ))
    return Estimate(macs * MAC_PJ[mac], fetch_energy_pj(dram_bytes, "dram"), fetch_energy_pj(sram_bytes, "sram"))
