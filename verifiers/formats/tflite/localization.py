"""TFLite artifacts for localisation: the main subgraph read from the flatbuffer, what converters
record of the source in tensor names, and runs in the LiteRT interpreter that keep every tensor.

What converters record (tensor names; ops have none, so an op is named after its first output):
- the TensorFlow converter names a tensor after the TensorFlow op(s) it comes from, joined by ";"
  when it fused several (`model/dense/MatMul;model/dense/BiasAdd;model/dense/Relu` for a
  FULLY_CONNECTED with a fused activation); the source's tensors are those names with `:0`;
- litert-torch names a tensor after the module path it was computed in, each level spelt
  `package.Class_attribute` below the root's class (`BertModel/BertEncoder_encoder/BertLayer_0/...`),
  with `;N` and further `;`-joined paths where MLIR merged locations.

A run keeps every tensor (experimental_preserve_all_tensors) with the builtin kernels and no
delegate (a delegate computes its partition in its own memory). Replacing tensors rewrites the
flatbuffer: each replaced tensor gets a new subgraph input that its readers read instead;
signatures are dropped, so every input is fed by tensor index.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np

from verifiers.localization.graph import ArtifactGraph, OpView, Scope, TensorView
from verifiers.tflite_model import NUMPY_DTYPES, load_tflite, pack, schema, tflite_op_labels, unpack, user_scope

# ActivationFunctionType -> the activation fused into an op (NONE and SIGN_BIT are none).
FUSED_ACTIVATIONS = {1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH"}
_BIASED = frozenset({"FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "CONV_3D"})
# A litert-torch module level: a dotted class path, "_", the attribute ("torch.nn.modules.linear.Linear_query").
_CLASS_LEVEL = re.compile(r"^[A-Za-z_][\w.]*\.[A-Za-z_]\w*_\w+$")


class TfliteGraph(ArtifactGraph):
    format = "tflite"

    def __init__(self, path: Path):
        self.path = Path(path)
        self.model = load_tflite(self.path)
        graph = self.model.subgraphs[0]
        self.tensors = {}
        for index, tensor in enumerate(graph.tensors):
            dtype = NUMPY_DTYPES.get(tensor.type)
            constant = tensor.buffer > 0 and self.model.buffers[tensor.buffer][1] > 0
            name = user_scope(tensor.name)
            self.tensors[str(index)] = TensorView(str(index), name, tuple(tensor.shape),
                                                  None if dtype is None else np.dtype(dtype).name, constant,
                                                  keys=_keys(name))
        self.ops = []
        for index, (op, label) in enumerate(zip(graph.operators, tflite_op_labels(self.model))):
            inputs = tuple(str(i) if i >= 0 else "" for i in op.inputs)
            outputs = tuple(str(i) for i in op.outputs if i >= 0)
            first = self.tensors[outputs[0]].name if outputs else ""
            self.ops.append(OpView(index, label, self.model.opcode(op).name, inputs, outputs, _scope(first),
                                   tuple(dict.fromkeys(k for t in outputs for k in self.tensors[t].keys)),
                                   activation=self._fused_activation(op),
                                   bias=self.model.opcode(op).name in _BIASED and len(inputs) > 2 and bool(inputs[2])))
            for tensor_id in inputs:
                if tensor_id:
                    self.tensors[tensor_id].readers.append(index)
            for tensor_id in outputs:
                self.tensors[tensor_id].producer = index
        signature = next((s for s in sorted(self.model.signatures, key=lambda s: s.key != "serving_default")
                          if s.subgraph == 0), None)
        if signature is not None:
            self.inputs = {name: str(index) for name, index in signature.inputs}
            self.output_names = {name: str(index) for name, index in signature.outputs}
        else:
            self.inputs = {graph.tensors[i].name: str(i) for i in graph.inputs}
            self.output_names = {graph.tensors[i].name: str(i) for i in graph.outputs}
        self.outputs = [str(i) for i in graph.outputs]

    def constant(self, tensor_id):
        return self.model.constant(0, int(tensor_id))

    def _fused_activation(self, op) -> str | None:
        if not op.options_type:
            return None
        options = self.model.options(0, op.index)
        return FUSED_ACTIVATIONS.get(int(getattr(options, "fusedActivationFunction", 0) or 0))

    def run(self, feed, keep, replace, runner_class):
        by_index = {self.inputs[name]: value for name, value in feed.items() if name in self.inputs}
        content = self._rewritten(replace, by_index) if replace else self.model.data
        return runner_class.run_inspection(content, by_index, keep)

    def _rewritten(self, replace: dict[str, np.ndarray], feed: dict[str, np.ndarray]) -> bytes:
        """The flatbuffer with each replaced tensor read from a new input (fed under its index in
        `feed`, which this adds to) and no signatures."""
        s = schema()
        model = unpack(self.model.data)
        if any(buffer.offset > 1 for buffer in model.buffers or []):
            raise ValueError("buffers stored outside the flatbuffer (offset/size) cannot be rewritten")
        graph = model.subgraphs[0]
        for tensor_id, value in replace.items():
            old = graph.tensors[int(tensor_id)]
            new = s.TensorT()
            new.shape, new.type, new.buffer = list(value.shape), old.type, 0
            new.name = (old.name or b"") + b"::source"
            graph.tensors.append(new)
            index = len(graph.tensors) - 1
            for op in graph.operators:
                op.inputs = [index if i == int(tensor_id) else i for i in op.inputs]
            graph.inputs = [*graph.inputs, index]
            feed[str(index)] = value
        model.signatureDefs = []
        return pack(model)


def _parts(name: str) -> list[str]:
    """The paths a tensor name joins with ";" (uniquifying numbers and empty parts left out)."""
    return [part for part in name.split(";") if part and not part.isdigit()]


def _keys(name: str) -> tuple[str, ...]:
    """The TensorFlow tensors a converter named this tensor after, the last fused op first, each
    also without its first name scope (the model's, which Keras suffixes anew at each trace)."""
    return tuple(key for part in reversed(_parts(name)) for spelling in (part, part.split("/", 1)[-1])
                 for key in (f"{spelling}:0", spelling))


def _scope(name: str) -> Scope | None:
    parts = _parts(name)
    if not parts:
        return None
    levels = parts[0].split("/")
    if any(_CLASS_LEVEL.match(level) for level in levels[1:]):  # litert-torch: the levels every part shares
        for part in parts[1:]:
            levels = [a for a, _ in itertools.takewhile(lambda pair: pair[0] == pair[1], zip(levels, part.split("/")))]
        return Scope(tuple(levels), "classes")
    return Scope(tuple(levels[:-1]), "tf")
