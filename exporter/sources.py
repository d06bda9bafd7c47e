"""Turn a MODEL spec into a Source, and input specs into arrays.

Nothing else in exportgate imports a user's file.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verifiers.errors import BadInput, MissingFramework, one_line
from exporter.frameworks import (
    FRAMEWORKS,
    Framework,
    framework_for_file,
    framework_for_object,
)

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
    framework: Framework
    model: Any
    inputs: list[InputSpec]
    example: dict[str, np.ndarray] | None = None
    by_keyword: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    def run(self, feed: dict[str, np.ndarray]) -> tuple[list[str], bool, list[np.ndarray]]:
        """Run the source model: (output names, whether the names are the model's own, arrays)."""
        try:
            return self.framework.run(self, feed)
        except BadInput:
            raise
        except Exception as exc:
            raise BadInput(f"the source model failed on its inputs: {one_line(exc)}") from exc


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


def load_source(
    spec: str, input_specs: list[InputSpec] | None = None, default_inputs: list[InputSpec] | None = None,
    trust_source: bool = False,
) -> Source:
    """Load `file.py:callable`, `model.keras` or `model.pt2`.

    `default_inputs` (read off an artifact being verified) serve a model that comes with neither
    example inputs nor --input specs. A model file whose loading can run code (a .pt2) loads
    only with `trust_source`; a file.py runs by design.
    """
    from exporter.frameworks.keras_framework import prepare_keras_environment

    prepare_keras_environment()  # before a user's file imports keras
    input_specs = list(input_specs or [])
    path_text, sep, attr = spec.rpartition(":")
    if sep and path_text.endswith(".py"):
        model, example = _call_builder(Path(path_text), attr)
        framework = framework_for_object(model)
    else:
        path = Path(spec)
        if not path.exists():
            raise BadInput(f"{spec}: no such file")
        framework = framework_for_file(path)
        if framework.load_runs_code and not trust_source:
            raise BadInput(f"{spec}: {framework.load_runs_code}; pass --trust-source to load a file you trust")
        model, example = framework.load_file(path), None
    return framework.make_source(spec, model, example, input_specs, list(default_inputs or []))


def _module_name(path: Path) -> str:
    """The name a user's file is imported under: its stem, so class paths in artifacts (TFLite
    tensor names) read as the user wrote them, unless that would shadow or be shadowed by another
    module; then a name unique to the file."""
    stem, resolved = path.stem, path.resolve()
    existing = sys.modules.get(stem)
    if stem.isidentifier():
        if existing is None and importlib.util.find_spec(stem) is None:
            return stem
        if existing is not None and Path(getattr(existing, "__file__", "") or "").resolve() == resolved:
            return stem
    return f"_exportgate_user_{abs(hash(resolved))}"


def _call_builder(path: Path, attr: str) -> tuple[Any, Any]:
    if not path.is_file():
        raise BadInput(f"{path}: no such file")
    if not attr.isidentifier():
        raise BadInput(f"{path}:{attr}: {attr!r} is not a callable name")
    module_name = _module_name(path)
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except ImportError as exc:
        _raise_missing_framework(exc)
        raise BadInput(f"{path}: import failed: {one_line(exc)}") from exc
    except Exception as exc:
        raise BadInput(f"{path}: failed to load: {one_line(exc)}") from exc
    builder = getattr(module, attr, None)
    if builder is None:
        raise BadInput(f"{path}: no callable named {attr!r}")
    if not callable(builder):
        raise BadInput(f"{path}:{attr} is not callable")
    try:
        built = builder()
    except Exception as exc:
        raise BadInput(f"{path}:{attr}() raised {one_line(exc)}") from exc
    if isinstance(built, tuple) and len(built) == 2 and isinstance(built[1], (tuple, list, dict)):
        return built[0], built[1]
    return built, None


def _raise_missing_framework(exc: ImportError) -> None:
    missing = getattr(exc, "name", None) or ""
    for framework in FRAMEWORKS.values():
        if missing.split(".")[0] in framework.modules:
            raise MissingFramework(missing.split(".")[0], framework.extra) from exc


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

