"""GELU sites at 8-bit resolution: what an int8 (or uint8) output can show of a flavour.

A full-integer TFLite GELU (builtin version 2) is a 256-entry lookup table built at prepare time
(tensorflow/lite/kernels/gelu.cc, LUTPopulate): for every input code q, quantize(f(dequantize(q)))
with the input's and the output's scale and zero point, f the exact or tanh GELU by the
`approximate` option, rounded half away from zero and clamped. `Int8Grid.table` builds the same
table for any catalogued flavour, so running the op on all 256 codes tells which flavour's table it
holds (`classify_table`). An ONNX Gelu between DequantizeLinear and QuantizeLinear runs in float;
the QuantizeLinear after it rounds its output the same way.

Resolution rule: two flavours are distinguishable at a site when their largest gap on the site's
input grid, after clamping to the output's range, is at least one output step (the output scale):
then at least one table entry must differ. Below one step their tables are equal, or differ by one
step only where a rounding boundary happens to fall between them, so the site's int8 output
cannot tell them apart. Exact and tanh are at most 4.73e-4 apart, under every usual int8 output
scale (0.01-0.05); quick (2.03e-2 from exact) is often above it; ReLU (0.17) nearly always.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .catalogue import FLAVOURS, UNKNOWN
from .classification import CORE_LIMIT, Classification

RANGES = {"int8": (-128, 127), "uint8": (0, 255)}  # the 8-bit types a site is measured in
TABLE_SIZE = 256
_FLOAT_GRID = np.linspace(-CORE_LIMIT, CORE_LIMIT, 12001)  # a float input: every 1e-3 of the core


@dataclass(frozen=True)
class Int8Grid:
    """The 8-bit quantization around a site: the output it is rounded to (dtype, scale, zero point)
    and the input grid it is computed on (None when its input is float)."""

    dtype: str
    output_scale: float
    output_zero_point: int
    input_scale: float | None = None
    input_zero_point: int | None = None

    def codes(self) -> np.ndarray:
        """Every input code, in the site's 8-bit type."""
        low, high = RANGES[self.dtype]
        return np.arange(low, high + 1).astype(self.dtype)

    def inputs(self) -> np.ndarray:
        """The values the site is computed at (float64): the dequantized input codes, or a dense core grid."""
        if self.input_scale is None:
            return _FLOAT_GRID
        return self.input_scale * (self.codes().astype(np.float64) - self.input_zero_point)

    def quantize(self, y: np.ndarray) -> np.ndarray:
        """y as output codes: y / scale rounded half away from zero, plus the zero point, clamped (int64)."""
        low, high = RANGES[self.dtype]
        scaled = np.asarray(y, dtype=np.float64) / self.output_scale
        return np.clip(np.sign(scaled) * np.floor(np.abs(scaled) + 0.5) + self.output_zero_point, low, high).astype(np.int64)

    def dequantize(self, codes: np.ndarray) -> np.ndarray:
        return self.output_scale * (np.asarray(codes, dtype=np.float64) - self.output_zero_point)

    def table(self, name: str) -> np.ndarray:
        """The output codes flavour `name` gives on the input grid."""
        return self.quantize(FLAVOURS[name].reference(self.inputs()))

    def gap(self, a: str, b: str) -> float:
        """Largest |a(x) - b(x)| on the input grid, both clamped to the output's range."""
        low, high = (self.dequantize(c) for c in RANGES[self.dtype])
        x = self.inputs()
        return float(np.max(np.abs(np.clip(FLAVOURS[a].reference(x), low, high)
                                   - np.clip(FLAVOURS[b].reference(x), low, high))))

    def unresolved(self, name: str, others: list[str] | tuple[str, ...]) -> dict[str, float]:
        """The flavours among `others` the site's output cannot tell from flavour `name` (their gap
        is under one output step, see the module docstring), each with its gap."""
        gaps = {other: self.gap(name, other) for other in others}
        return {other: gap for other, gap in gaps.items() if gap < self.output_scale}

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "output_scale": self.output_scale, "output_zero_point": self.output_zero_point,
                "input_scale": self.input_scale, "input_zero_point": self.input_zero_point}


def referenced() -> list[str]:
    """The catalogued flavours with a reference curve, catalogue order."""
    return [f.name for f in FLAVOURS.values() if f.reference is not None]


def classify_table(grid: Int8Grid, output_codes: np.ndarray) -> Classification:
    """Which flavour's table a site's output codes on `grid.codes()` are.

    The nearest table by count of differing entries (catalogue order among equals) names the
    flavour; it is confident when no entry is off by more than one step (float32 kernels round
    ties their own way), else unknown, not confident. Residuals are max |dequantized output - f(x)|
    on the grid; table_differences counts the differing entries per flavour.
    """
    out = np.asarray(output_codes).reshape(-1).astype(np.int64)
    if out.size != TABLE_SIZE:
        raise ValueError(f"{out.size} output codes for {TABLE_SIZE} input codes")
    x, y = grid.inputs(), grid.dequantize(out)
    tables = {name: grid.table(name) for name in referenced()}
    differing = {name: int(np.count_nonzero(t != out)) for name, t in tables.items()}
    residuals = {name: float(np.max(np.abs(y - FLAVOURS[name].reference(x)))) for name in tables}
    nearest = min(differing, key=differing.get)
    steps = int(np.max(np.abs(tables[nearest] - out)))
    samples = tuple((float(a), float(b)) for a, b in zip(x, y))
    if steps > 1:
        return Classification(UNKNOWN, residuals, False,
                              f"{grid.dtype} table matches no catalogued flavour's: nearest {nearest} "
                              f"({differing[nearest]} of {TABLE_SIZE} entries differ, up to {steps} steps)",
                              samples=samples, table_differences=differing)
    alike = [name for name in differing if differing[name] == differing[nearest]]
    return Classification(nearest, residuals, True,
                          f"{grid.dtype} table of {' = '.join(alike)} ({differing[nearest]} of {TABLE_SIZE} "
                          f"entries differ; output scale {grid.output_scale:.3g})",
                          samples=samples, table_differences=differing)
