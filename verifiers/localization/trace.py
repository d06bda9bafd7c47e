"""What the source model computed on one batch, tensor by tensor: the source side of localisation.

The model layer captures it (exporter.tracing: a PyTorch program's FX nodes, a Keras model's
TensorFlow ops) and hands it to the artifact layer as plain arrays, so nothing here imports a
framework. Each tensor carries where the source computes it: its op, its module (PyTorch module
path, Keras layer path) and the source line the framework recorded.

Besides the values every op produced, a trace holds finer values for ops that exporters split into
several (the product of a linear layer before its bias, the scores and weights inside an attention,
the mean and variance inside a LayerNorm): an artifact that computes those separately has each of
its steps matched, so a fault is pinned to the step that made it. A fine value's `parent` is the op
it belongs to.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np


# Ops that add (a bias, when their other operand is a constant), in PyTorch's and TensorFlow's traces.
BIAS_ADDS = frozenset({"aten.add", "Add", "AddV2", "BiasAdd"})
# Ops that only move, copy or relabel data, in PyTorch's and TensorFlow's traces.
MOVES = frozenset({
    "aten.clone", "aten.view", "aten._unsafe_view", "aten.reshape", "aten.transpose", "aten.permute", "aten.expand",
    "aten.unsqueeze", "aten.squeeze", "aten.alias", "aten.detach", "aten.t", "aten._to_copy", "aten.contiguous",
    "aten.flatten", "Identity", "Reshape", "Transpose", "ExpandDims", "Squeeze", "Cast",
})


@dataclass
class SourceTensor:
    key: str  # unique in the trace: "linear_3" (FX node), "model/dense/MatMul:0" (TF), "linear_3.matmul" (fine)
    value: np.ndarray  # float32 (floating sources) or the tensor's own dtype (integers, booleans)
    op: str  # what computes it: "aten.linear", "MatMul", "input"
    module: str  # "encoder.layer.3.attention.self.query" or "transformer/dense"; "" at the root
    location: str | None = None  # "model.py:88", where the framework records the line that made it
    inputs: tuple[str, ...] = ()  # keys of the traced tensors it reads
    order: int = 0  # position in the source's execution order
    parent: str | None = None  # a fine value: the key of the op it is a step of
    # max |float32 - float64| of the op recomputed in float64 on the same float32 inputs: the float32
    # rounding of this op alone (None where the framework cannot recompute it)
    rounding: float | None = None

    @property
    def is_float(self) -> bool:
        return self.value.dtype.kind == "f"


@dataclass
class SourceTrace:
    framework: str  # "torch", "keras"
    separator: str = "."  # between the parts of a module path ("." PyTorch, "/" Keras)
    tensors: dict[str, SourceTensor] = field(default_factory=dict)  # in execution order
    inputs: dict[str, str] = field(default_factory=dict)  # the model's input name -> its key
    outputs: list[str | None] = field(default_factory=list)  # the key of each model output, in its order
    aliases: dict[str, str] = field(default_factory=dict)  # another spelling of a key -> the key
    notes: list[str] = field(default_factory=list)  # what the capture could not do

    def add(self, tensor: SourceTensor) -> SourceTensor:
        tensor.order = len(self.tensors)
        self.tensors[tensor.key] = tensor
        return tensor

    @functools.cached_property
    def constants(self) -> set[str]:
        """Keys computed from constants alone (no model input upstream): a BatchNorm's folded shift."""
        found = set()
        for tensor in self.coarse():
            if tensor.op != "input" and all(k in found for k in tensor.inputs):
                found.add(tensor.key)
        return found

    def __getitem__(self, key: str) -> SourceTensor:
        return self.tensors[key]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def resolve(self, name: str) -> str | None:
        """The key a name an artifact records stands for (itself or one of its aliases), or None."""
        return name if name in self.tensors else self.aliases.get(name)

    def coarse(self) -> list[SourceTensor]:
        """The tensors ops produced (no fine values), in execution order."""
        return [t for t in self.tensors.values() if t.parent is None]

    def fine(self, key: str) -> list[SourceTensor]:
        """The fine values of one op."""
        return self._steps.get(key, [])

    @functools.cached_property
    def _steps(self) -> dict[str, list[SourceTensor]]:
        found: dict[str, list[SourceTensor]] = {}
        for tensor in self.tensors.values():
            if tensor.parent is not None:
                found.setdefault(tensor.parent, []).append(tensor)
        return found

    @functools.cached_property
    def biased(self) -> set[str]:
        """Keys the source adds a bias to next: read by an add whose other operands are constants."""
        constants = self.constants
        found = set()
        for tensor in self.coarse():
            varying = [k for k in tensor.inputs if k not in constants]
            if tensor.op in BIAS_ADDS and len(varying) == 1:
                found.add(varying[0])
        return found

    def consumers(self) -> dict[str, list[str]]:
        """key -> keys of the coarse tensors that read it."""
        found: dict[str, list[str]] = {}
        for tensor in self.coarse():
            for name in tensor.inputs:
                found.setdefault(name, []).append(tensor.key)
        return found

    def module_outputs(self) -> dict[str, str]:
        """Module path -> the key of its output: the last tensor computed inside the module (or a
        submodule) that is read outside it, or is a model output."""
        consumers = self.consumers()
        by_key = self.tensors
        found: dict[str, str] = {}
        for tensor in self.coarse():
            if not tensor.module or not tensor.is_float:
                continue
            for module in self.enclosing(tensor.module):
                readers = consumers.get(tensor.key, [])
                if not readers or any(not self.inside(by_key[r].module, module) for r in readers):
                    found[module] = tensor.key
        return found

    def enclosing(self, module: str) -> list[str]:
        """"a.b.c" -> ["a", "a.b", "a.b.c"]: the module and every module holding it."""
        parts = module.split(self.separator) if module else []
        return [self.separator.join(parts[:i]) for i in range(1, len(parts) + 1)]

    def inside(self, module: str, parent: str) -> bool:
        """Whether `module` is `parent` or one of its submodules."""
        return not parent or module == parent or module.startswith(parent + self.separator)

    def ancestors(self, key: str, stop: set[str]) -> list[str]:
        """The coarse keys `key` is computed from, back to (not through) `stop` and the inputs,
        `key` included, in execution order."""
        seen: set[str] = set()
        todo = [key]
        while todo:
            current = todo.pop()
            if current in seen or current not in self.tensors:
                continue
            seen.add(current)
            if current != key and current in stop:
                continue
            todo.extend(self.tensors[current].inputs)
        return [k for k in self.tensors if k in seen and (k == key or k not in stop)
                and self.tensors[k].op != "input"]
