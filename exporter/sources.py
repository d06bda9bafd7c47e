"""A loaded source model (Source), the input specs it runs on, and the seeded batches made from them.

exporter.frameworks loads a MODEL spec into a Source; this module knows nothing of frameworks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verifiers.errors import BadInput, ExportgateError, one_line

SUPPORTED_DTYPES = {
    "float32", "float16", "float64", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool",
}
# A None (unknown) dimension in a model's own input spec becomes this size.
DEFAULT_DYNAMIC_SIZE = 2
# Random float batches are standard normal times this, so activations reach |x| of 3 and more,
# the range where GELU flavours differ.
FLOAT_BATCH_SCALE = 2.0


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    low: float | None = None
    high: float | None = None

    def describe(self) -> str:
        shape = "x".join(str(d) for d in self.shape) or "scalar"
        return f"{self.name}:{shape}:{self.dtype}"


@dataclass(frozen=True)
class DynamicAxis:
    input: str
    axis: int


@dataclass
class Source:
    """A loaded source model with everything needed to run it and export it."""

    spec: str
    framework: Any  # the exporter.frameworks.Framework that loaded it and runs it
    model: Any
    inputs: list[InputSpec]
    example: dict[str, np.ndarray] | None = None
    by_keyword: bool = False
    notes: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # what it was built from (exporter.source_files)

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    def release(self) -> None:
        """Drop the model once nothing runs it any more (an export's verification runs only the
        artifact): its weights go back before the runtime loads the artifact's beside them."""
        self.model = None

    def run(self, feed: dict[str, np.ndarray]) -> tuple[list[str], bool, list[np.ndarray]]:
        """Run the source model: (output names, whether the names are the model's own, arrays)."""
        try:
            return self.framework.run(self, feed)
        except BadInput:
            raise
        except Exception as exc:
            raise BadInput(f"the source model failed on its inputs: {one_line(exc)}") from exc

    def activation_sites(self, feed: dict[str, np.ndarray]) -> list | str:
        """The source's GELU and ReLU sites (verifiers.gelu Site records) read as its framework runs
        it on `feed`, or why they could not be read (the GELU guard then fails the run).

        An export reads them before exporting: an exporter may change the model it is given (the
        TorchScript exporter's tracing leaves transformers' Swin with tensor window sizes)."""
        from verifiers.quiet import quiet_exporter

        try:
            with quiet_exporter():
                return self.framework.activation_sites(self, feed)
        except ExportgateError:
            raise
        except Exception as exc:  # noqa: BLE001 - any capture failure is reported, not raised
            return one_line(exc)


_INPUT_SPEC = re.compile(
    r"^(?P<name>[^:]+):(?P<shape>[0-9x]*|scalar):(?P<dtype>[a-z0-9]+)"
    r"(?::(?P<low>-?[0-9.eE+-]+)\.\.(?P<high>-?[0-9.eE+-]+))?$"
)


def parse_input_spec(text: str) -> InputSpec:
    """NAME:SHAPE:DTYPE[:LOW..HIGH], e.g. input_ids:2x16:int64:0..1000 (HIGH exclusive)."""
    match = _INPUT_SPEC.match(text)
    if not match:
        raise BadInput(
            f"--input {text!r}: expected NAME:SHAPE:DTYPE[:LOW..HIGH], e.g. input_ids:2x16:int64:0..1000"
        )
    dtype = match["dtype"]
    if dtype not in SUPPORTED_DTYPES:
        raise BadInput(f"--input {text!r}: unknown dtype {dtype!r} (one of {', '.join(sorted(SUPPORTED_DTYPES))})")
    shape_text = match["shape"]
    shape = () if shape_text in ("", "scalar") else tuple(int(d) for d in shape_text.split("x") if d)
    if any(d <= 0 for d in shape):
        raise BadInput(f"--input {text!r}: every dimension must be positive")
    low = high = None
    if match["low"] is not None:
        try:
            low, high = float(match["low"]), float(match["high"])
        except ValueError:
            raise BadInput(f"--input {text!r}: LOW..HIGH must be numbers") from None
        if not low < high:
            raise BadInput(f"--input {text!r}: LOW must be below HIGH")
    return InputSpec(match["name"], shape, dtype, low, high)


def parse_dynamic_axis(text: str) -> DynamicAxis:
    name, _, axis = text.rpartition(":")
    if not name or not axis.lstrip("-").isdigit():
        raise BadInput(f"--dynamic {text!r}: expected NAME:AXIS, e.g. input_ids:0")
    return DynamicAxis(name, int(axis))


def specs_of_tensors(tensors: list) -> list[InputSpec]:
    """Input specs read off an artifact's inputs (verifiers.runtimes TensorInfo), for sources that
    come without example inputs: each dynamic axis gets DEFAULT_DYNAMIC_SIZE."""
    return [
        InputSpec(t.name, tuple(d if isinstance(d, int) and d > 0 else DEFAULT_DYNAMIC_SIZE for d in t.shape), t.dtype)
        for t in tensors
    ]


def make_batches(source: Source, seed: int, count: int) -> list[dict[str, np.ndarray]]:
    """The example inputs (when the source has them) plus `count` seeded random batches."""
    rng = np.random.default_rng(seed)
    batches = []
    if source.example is not None:
        batches.append(source.example)
    for _ in range(count):
        batches.append({spec.name: random_array(spec, rng, source.example) for spec in source.inputs})
    if not batches:
        raise BadInput("--batches 0 and the model has no example inputs: nothing to run it on "
                       "(give --batches 1 or more)")
    return batches


def random_array(spec: InputSpec, rng: np.random.Generator, example: dict | None) -> np.ndarray:
    dtype = np.dtype("float32" if spec.dtype == "bfloat16" else spec.dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=spec.shape).astype(bool)
    if dtype.kind in "iu":
        low, high = spec.low, spec.high
        if low is None and example is not None and spec.name in example:
            sample = example[spec.name]
            low, high = float(sample.min()), float(sample.max()) + 1
        if low is None:
            low, high = 0, 2
        return rng.integers(int(low), int(high), size=spec.shape).astype(dtype)
    if spec.low is not None:
        return rng.uniform(spec.low, spec.high, size=spec.shape).astype(dtype)
    return (rng.standard_normal(spec.shape) * FLOAT_BATCH_SCALE).astype(dtype)

