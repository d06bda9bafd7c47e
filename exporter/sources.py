"""A loaded source model (Source), the input specs it runs on, and the seeded batches made from them.

exporter.frameworks loads a MODEL spec into a Source; this module knows nothing of frameworks.
"""

from __future__ import annotations

import gc
import re
import sys
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verifiers.errors import BadInput, ExportgateError, one_line, raised
from verifiers.gelu.configured import Declared
from verifiers.sizes import (
    DynamicAxis,
    artifact_axes,
    default_sizes,
    is_padding_mask,
    padding_mask,
    padding_sides,
    values_like,
)

SUPPORTED_DTYPES = {
    "float32", "float16", "float64", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool",
}
# Random float batches are standard normal times this, so activations reach |x| of 3 and more,
# the range where GELU flavours differ.
FLOAT_BATCH_SCALE = 2.0


# Modules imported since the collector last set aside what was alive; past this many, it does again.
_MODULES_BETWEEN_FREEZES = 200
_modules_at_freeze = 0


def set_aside_imported_objects() -> None:
    """Move what is alive into the collector's permanent generation (gc.freeze) when many modules
    have been imported since the last time, before a source is loaded: a framework's import makes
    some 500k objects that live as long as the process, and every full collection walks them again
    (0.2 s on 2 cores), the one that releases a source's weights included. Garbage is collected
    first, so only live objects are set aside; this happens once per framework a process imports,
    not once per model."""
    global _modules_at_freeze
    if len(sys.modules) - _modules_at_freeze < _MODULES_BETWEEN_FREEZES:
        return
    gc.collect()
    gc.freeze()
    _modules_at_freeze = len(sys.modules)


def _collect(held: weakref.ref | None) -> None:
    """Collect what a released model leaves in reference cycles; `held` (a weak reference to the
    model, None where it takes none) still alive after that: it is in a cycle through objects set
    aside, which go back to the collector for good, as if nothing had been set aside."""
    gc.collect()
    if held is None or held() is not None:
        gc.unfreeze()
        gc.collect()


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
    dynamic: list[DynamicAxis] = field(default_factory=list)  # axes the model declares dynamic (Keras None)
    facts: dict[str, str] = field(default_factory=dict)  # a model folder's model_type and task (report fields)
    configured: Declared | None = None  # the activations its config declares (a model folder)
    beside: list[Path] = field(default_factory=list)  # published beside the artifact (a model folder's tokenizer)
    example_origin: str = "the source's example inputs"  # what report.feeds says of the example batch

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    def release(self, collect_aside: bool = False) -> threading.Thread | None:
        """Drop the model once nothing runs it any more (an export's verification runs only the
        artifact): its weights go back before the runtime loads the artifact's beside them (now:
        Keras and transformers models hold reference cycles, which only the collector frees; it
        walks only what was made since objects were last set aside, unless the model outlives that).
        `collect_aside`: the collection runs in a thread, returned (to join), while the caller goes
        on to wait for the runtime's worker (a full collection: 0.2 s for a torch process)."""
        model, self.model = self.model, None
        try:
            held = weakref.ref(model)
        except TypeError:  # nothing will tell when it is gone: look everywhere
            held = None
        del model
        if not collect_aside:
            _collect(held)
            return None
        thread = threading.Thread(target=_collect, args=(held,), name="exportgate-release-source", daemon=True)
        thread.start()
        return thread

    def run(self, feed: dict[str, np.ndarray]) -> tuple[list[str], bool, list[np.ndarray]]:
        """Run the source model: (output names, whether the names are the model's own, arrays)."""
        try:
            return self.framework.run(self, feed)
        except BadInput:
            raise
        except Exception as exc:
            raise BadInput(f"the source model failed on its inputs: {raised(exc)}") from exc

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


_DYNAMIC_AXIS = re.compile(r"^(?P<name>.+):(?P<axis>[0-9]+)(?::(?P<low>[0-9]*)\.\.(?P<high>[0-9]*))?$")


def parse_dynamic_axis(text: str) -> DynamicAxis:
    """NAME:AXIS[:MIN..MAX], e.g. input_ids:1 or input_ids:1:1..512 (MIN and MAX inclusive, either
    may be left out)."""
    match = _DYNAMIC_AXIS.match(text)
    if not match:
        raise BadInput(f"--dynamic {text!r}: expected NAME:AXIS[:MIN..MAX], e.g. input_ids:1 or input_ids:1:1..512")
    low = int(match["low"]) if match["low"] else 1
    high = int(match["high"]) if match["high"] else None
    if low < 1 or (high is not None and high < low):
        raise BadInput(f"--dynamic {text!r}: the range must satisfy 1 <= MIN <= MAX")
    return DynamicAxis(match["name"], int(match["axis"]), low=low, high=high)


def name_symbols(axes: list[DynamicAxis], feed: dict[str, np.ndarray]) -> list[DynamicAxis]:
    """Give every axis without one a symbol: axes at the same position whose export sizes agree
    share one ("batch" for axis 0, "dimK" for axis K, suffixed with the input's name when sizes
    at that position differ), so one batch or one sequence length moves over every input.
    The same (input, axis) given twice is one axis, within both ranges."""
    merged: dict[tuple[str, int], DynamicAxis] = {}
    for axis in axes:
        key = (axis.input, axis.axis)
        if key in merged:
            old = merged[key]
            highs = [h for h in (old.high, axis.high) if h is not None]
            axis = DynamicAxis(axis.input, axis.axis, old.symbol or axis.symbol, max(old.low, axis.low),
                               min(highs) if highs else None)
        merged[key] = axis
    groups = {(a.axis, int(feed[a.input].shape[a.axis])): a.symbol for a in merged.values() if a.symbol}
    taken = set(groups.values())
    named = []
    for axis in merged.values():
        size = int(feed[axis.input].shape[axis.axis])
        bounds = f"{axis.low}..{'' if axis.high is None else axis.high}"
        if axis.high is not None and axis.high < axis.low:
            raise BadInput(f"--dynamic {axis.input}:{axis.axis}: the ranges given for it do not overlap ({bounds})")
        if size < axis.low or (axis.high is not None and size > axis.high):
            raise BadInput(f"--dynamic {axis.input}:{axis.axis}:{bounds}: the export size {size} is outside the range")
        if not axis.symbol:
            key = (axis.axis, int(feed[axis.input].shape[axis.axis]))
            if key not in groups:
                base = "batch" if axis.axis == 0 else f"dim{axis.axis}"
                groups[key] = base if base not in taken else f"{base}_{axis.input}"
                taken.add(groups[key])
            axis = DynamicAxis(axis.input, axis.axis, groups[key], axis.low, axis.high)
        named.append(axis)
    return named


def apply_input_specs(source: Source, given: list[InputSpec], dynamic: list[DynamicAxis]) -> None:
    """--input on a loaded source: each given input takes its shape, type and range, and fixes the
    dynamic symbols along its axes (`dynamic`: every axis the model declares dynamic), so the other
    inputs sharing a symbol are resized with it and no axis of a fixed symbol stays dynamic. A
    source that brings example inputs gets them made anew at those sizes (seeded: given inputs in
    their range, the others like the example's values) and a note says so; none is dropped."""
    if not given:
        source.dynamic = dynamic
        return
    by_name = {spec.name: spec for spec in source.inputs}
    named = {spec.name: spec for spec in given}
    unknown = [name for name in named if name not in by_name]
    if unknown:
        raise BadInput(f"--input {unknown[0]}: no input of that name in {source.spec} "
                       f"(inputs: {', '.join(by_name)})")
    example = source.example
    for spec in given:
        if example is not None and spec.name in example:
            expected = example[spec.name]
            if spec.dtype != expected.dtype.name:
                raise BadInput(f"--input {spec.describe()}: {source.spec} takes {spec.name} as "
                               f"{expected.dtype.name}; give --input {spec.name}:...:{expected.dtype.name}")
            if len(spec.shape) != expected.ndim:
                raise BadInput(f"--input {spec.describe()}: {spec.name} has {expected.ndim} axes "
                               f"({'x'.join(map(str, expected.shape))} in the example); give a shape of that rank")
    fixed: dict[str, tuple[int, str]] = {}  # symbol -> (size, the input that fixed it)
    for axis in dynamic:
        spec = named.get(axis.input)
        if spec is None or axis.axis >= len(spec.shape):
            continue
        size = spec.shape[axis.axis]
        before = fixed.setdefault(axis.symbol, (size, spec.name))
        if before[0] != size:
            raise BadInput(f"--input {spec.describe()}: {axis.input} axis {axis.axis} ({axis.symbol}) is {size}, but "
                           f"--input {before[1]} makes {axis.symbol} {before[0]}; give one size for it")
    resized = {(a.input, a.axis): fixed[a.symbol][0] for a in dynamic if a.symbol in fixed}
    inputs = []
    for spec in source.inputs:
        if spec.name in named:
            inputs.append(named[spec.name])
        else:
            shape = tuple(resized.get((spec.name, k), d) for k, d in enumerate(spec.shape))
            inputs.append(InputSpec(spec.name, shape, spec.dtype, spec.low, spec.high))
    source.inputs = inputs
    source.dynamic = [a for a in dynamic if a.symbol not in fixed and a.input not in named]
    if example is not None:
        rng = np.random.default_rng(0)
        source.example = {spec.name: _example_at(spec, spec.name in named, example[spec.name], rng) for spec in inputs}
        sizes = ", ".join(f"{spec.name} {'x'.join(map(str, spec.shape)) or 'scalar'}" for spec in inputs)
        source.example_origin = "the source's example inputs made anew at the --input sizes (seed 0)"
        source.notes.append(f"--input: the example inputs were made anew (seeded) at the sizes given: {sizes}")


def _example_at(spec: InputSpec, given: bool, old: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """An example input at `spec`'s shape: a given input in its range when it states one, else
    like the old example's values; one neither given nor resized stays as it was."""
    if given and spec.low is not None:
        return random_array(spec, rng, None)
    if given or spec.shape != old.shape:
        return values_like(old, spec.shape, rng)
    return old


def stated_length_limit(model: Any) -> int | None:
    """The longest sequence a model says it takes, if it says so: a transformers config's
    max_position_embeddings (n_positions for GPT-2), keras-hub's max_sequence_length."""
    config = getattr(model, "config", None)
    for holder, name in ((config, "max_position_embeddings"), (config, "n_positions"),
                         (model, "max_sequence_length")):
        value = getattr(holder, name, None) if holder is not None else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def specs_of_tensors(tensors: list) -> list[InputSpec]:
    """Input specs read off an artifact's inputs (verifiers.runtimes TensorInfo), for sources that
    come without example inputs: dynamic axes that share a symbol get one size, distinct symbols
    distinct sizes from 2 up (verifiers.sizes.default_sizes)."""
    axes = artifact_axes(tensors)
    sizes = default_sizes([a.symbol for a in axes])
    size_of = {(a.input, a.axis): sizes[a.symbol] for a in axes}
    return [
        InputSpec(t.name, tuple(size_of.get((t.name, k), d) for k, d in enumerate(t.shape)), t.dtype)
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


def feeds_record(source: Source, feeds: list[dict[str, np.ndarray]], seed: int) -> list[dict[str, Any]]:
    """What each batch of make_batches fed (report.feeds): where it came from, and each input's
    shape, type and range of values."""
    records = []
    for k, feed in enumerate(feeds):
        example = source.example is not None and k == 0
        records.append({
            "batch": k,
            "origin": source.example_origin if example else f"seeded random (seed {seed})",
            "inputs": {name: {"shape": list(array.shape), "dtype": array.dtype.name,
                              "min": array.min().item() if array.size else None,
                              "max": array.max().item() if array.size else None}
                       for name, array in feed.items()},
        })
    return records


def random_array(spec: InputSpec, rng: np.random.Generator, example: dict | None) -> np.ndarray:
    """Seeded values for one input: like the example's where it has one (a padding mask stays one,
    padded on the sides the example's is: no row without a position to attend to), else in the
    spec's range."""
    dtype = np.dtype("float32" if spec.dtype == "bfloat16" else spec.dtype)
    if example is not None and spec.name in example and is_padding_mask(np.asarray(example[spec.name])):
        return padding_mask(spec.shape, dtype, rng, padding_sides(np.asarray(example[spec.name])))
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

