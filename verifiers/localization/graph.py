"""An artifact's graph as localisation sees it, whatever its format: ops in topological order, the
tensors between them, what the exporter recorded of the source (names, module scopes, source
lines), and two ways to run it in its runtime: with every tensor kept, and with chosen tensors
replaced by given values (the source's) for the ops that read them.

Each format's graph is in its package (verifiers.formats.onnx.localization,
verifiers.formats.tflite.localization), made by its `ArtifactFormat.localization_graph`; what it
builds runs through its runtime's `Runner.run_inspection` (verifiers.runtimes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Scope:
    """Where an exporter says an op comes from, in the exporter's own spelling: `parts` of a
    module path (PyTorch) or of a TensorFlow name scope (Keras), and how they are spelt:
    "module" (module paths, as the source traces them), "torchscript" (`layer.0` for a list's
    child), "classes" (`Class_attribute` parts, litert-torch) or "tf" (TensorFlow op names)."""

    parts: tuple[str, ...]
    style: str

    @property
    def path(self) -> str:
        """The scope as one path in the exporter's spelling, no source needed (where the source is
        at hand, verifiers.localization.align.resolve_scope names its module): PyTorch's parts
        joined by "." (a TorchScript list child's part, `layer.0`, as one), TensorFlow's by "/"."""
        return "/".join(self.parts) if self.style == "tf" else ".".join(self.parts)


@dataclass
class TensorView:
    id: str  # the artifact's handle: an ONNX value name, a TFLite tensor index
    name: str  # as the artifact names it
    shape: tuple[int, ...] | None
    dtype: str | None  # numpy dtype name
    constant: bool = False
    producer: int | None = None  # index of the op that computes it
    readers: list[int] = field(default_factory=list)
    # source tensors the exporter says this is (dynamo's FX node names, TensorFlow tensor names)
    keys: tuple[str, ...] = ()

    @property
    def is_float(self) -> bool:
        return self.dtype is not None and np.dtype(self.dtype).kind == "f"


@dataclass
class OpView:
    index: int  # topological position
    name: str
    op_type: str
    inputs: tuple[str, ...]  # tensor ids ("" for an input left out)
    outputs: tuple[str, ...]
    scope: Scope | None = None
    keys: tuple[str, ...] = ()  # the source ops the exporter made it from
    location: str | None = None  # "file.py:LINE" when the artifact records it
    activation: str | None = None  # an activation fused into the op (TFLite's fusedActivationFunction)
    bias: bool = False  # it adds a bias operand of its own (ONNX Conv and Gemm, TFLite's FULLY_CONNECTED...)


class ArtifactGraph:
    """One format's view of an artifact (see the module docstring)."""

    format: str
    ops: list[OpView]
    tensors: dict[str, TensorView]
    inputs: dict[str, str]  # the feed's name of each graph input -> its tensor id
    outputs: list[str]  # tensor ids of the graph's outputs
    output_names: dict[str, str]  # the name a runtime gives each graph output -> its tensor id

    def computed_floats(self) -> list[str]:
        """Tensors some op computes from the inputs (constants left out), in topological order,
        that are float or of a type the file does not declare (`learn` tells them apart)."""
        return [t for op in self.ops for t in op.outputs if t in self.tensors and not self.tensors[t].constant
                and (self.tensors[t].dtype is None or self.tensors[t].is_float)]

    def weights(self, op: OpView) -> tuple[np.ndarray, ...]:
        """The op's constant float inputs of two or more axes (its weights), as stored."""
        found = []
        for tensor_id in op.inputs:
            tensor = self.tensors.get(tensor_id)
            if tensor is not None and tensor.constant and tensor.is_float and tensor.shape and len(tensor.shape) >= 2:
                value = self.constant(tensor_id)
                if value is not None:
                    found.append(value)
        return tuple(found)

    def constant(self, tensor_id: str) -> np.ndarray | None:
        """A constant tensor's value (None where it cannot be read)."""
        raise NotImplementedError

    def learn(self, values: dict[str, np.ndarray]) -> list[str]:
        """Take the types and shapes a run gave; the float tensors among `values`, in order."""
        for tensor_id, value in values.items():
            tensor = self.tensors[tensor_id]
            tensor.dtype, tensor.shape = value.dtype.name, tuple(value.shape)
        return [t for t, value in values.items() if value.dtype.kind == "f"]

    def run(self, feed: dict[str, np.ndarray], keep: list[str], replace: dict[str, np.ndarray],
            runner_class) -> dict[str, np.ndarray]:
        """The tensors `keep` after one run on `feed`, with every op that reads a tensor of
        `replace` reading the value given there instead (the tensor itself is still computed)."""
        raise NotImplementedError
