"""Lower every TFLite GELU builtin to primitive builtins that old runtimes and delegates run.

  lower_gelu_ops(content) -> content
      matches  every GELU operator (opcode 150) of every subgraph, float32 only;
      writes   in its place, reading the GELU's input and writing its output tensor:
               approximate=True  -> the tanh chain with a x*x*x cube (MUL/ADD/TANH, no POW: the
                                    converter's GELU fusion does not see it, and TANH runs
                                    everywhere);
               approximate=False, or no GeluOptions table (which reads as exact) -> the exact
                                    GELU with erf written as Abramowitz & Stegun 7.1.26 without
                                    SIGN (DIV/RELU/NEG/MUL/ADD/EXP/SUB; SIGN needs runtime 2.11):
                                    erf(z) = q(relu(-z)) - q(relu(z)), see
                                    verifiers.formats.onnx.gelu_writer._exact_erf_free.
               Each flavour's `no_erf_form` in the catalogue (tanh/primitives, exact/erf_free),
               written by the same functions as verifiers.formats.onnx.gelu_writer.FORMS. Every new op is version 1 of a
               builtin that TFLite 1.x/2.x runtimes have had since before 2.0 (MUL, ADD, SUB,
               DIV, TANH, EXP, NEG, RELU); constants are new scalar float32 tensors with their
               own buffers, shared by the sites of a subgraph.

GELU operator codes no operator uses any more are dropped (an old runtime rejects a model whose
operator_codes name GELU: "Op builtin_code out of range: 150"), and the min_runtime_version
metadata, when present, is recomputed with
verifiers.tflite_runtime_versions.min_runtime_version_for over the operators left (the TF
converter writes 2.9.0 for GELU). Tensors are only appended, so the signatures and the names and
indices of inputs and outputs stay as they were. A model without GELU comes back byte for byte.

The guard recognises both forms as the GELU's flavour: the tanh chain as a tanh-chain site, the
erf-free unit as an erf unit (verifiers.gelu.chains.find_erf_units) inside an erf-chain site.
"""

from __future__ import annotations

import numpy as np

from verifiers.gelu.catalogue import TANH, TFLITE, claim_for, claimed_by, flavour
from verifiers.formats.onnx.gelu_writer import CONSTANTS, FORMS
from verifiers.tflite_model import (
    MIN_RUNTIME_VERSION_KEY,
    builtin_name,
    pack,
    schema,
    unpack,
)
from verifiers.tflite_runtime_versions import min_runtime_version_for

GELU = 150
FLOAT32 = 0  # TensorType
_BUILTINS = {"Mul": "MUL", "Add": "ADD", "Sub": "SUB", "Div": "DIV", "Tanh": "TANH", "Exp": "EXP",
             "Neg": "NEG", "Relu": "RELU"}
_OPTIONS = {"MUL": "MulOptions", "ADD": "AddOptions", "SUB": "SubOptions", "DIV": "DivOptions"}
# The GELU builtin's approximate flag for the tanh flavour (what --gelu tanh sets).
_TANH_FLAG = claim_for(TANH, TFLITE, "GELU").attr("approximate")


def _code(opcode) -> int:
    return max(opcode.builtinCode, opcode.deprecatedBuiltinCode)


class _Writer:
    """Writes a form's nodes as TFLite operators into one subgraph; tensors are tensor indices.

    The interface of onnx_writer._Writer (node, const), so FORMS' write functions run unchanged.
    """

    def __init__(self, model, subgraph, constants: dict[str, int], prefix: str, like):
        self.model, self.subgraph, self.constants, self.prefix, self.like = model, subgraph, constants, prefix, like
        self.operators: list = []
        self.count = 0

    def _tensor(self, name: str, shape, signature, buffer: int) -> int:
        s = schema()
        tensor = s.TensorT()
        tensor.name, tensor.type, tensor.buffer = name.encode(), FLOAT32, buffer
        tensor.shape = None if shape is None else list(shape)
        tensor.shapeSignature = None if signature is None else list(signature)
        self.subgraph.tensors.append(tensor)
        return len(self.subgraph.tensors) - 1

    def const(self, key: str) -> int:
        """A scalar float32 constant tensor holding CONSTANTS[key] (one per key and subgraph)."""
        if key not in self.constants:
            s = schema()
            buffer = s.BufferT()
            buffer.data = np.frombuffer(np.float32(CONSTANTS[key]).tobytes(), np.uint8)
            self.model.buffers.append(buffer)
            self.constants[key] = self._tensor(f"exportgate/gelu/{key}", [], None, len(self.model.buffers) - 1)
        return self.constants[key]

    def node(self, op_type: str, inputs, output: int | None = None, **attrs) -> int:
        s = schema()
        name = _BUILTINS[op_type]
        if output is None:
            self.count += 1
            output = self._tensor(f"{self.prefix}/{name.lower()}_{self.count}", self.like.shape,
                                  self.like.shapeSignature, 0)
        op = s.OperatorT()
        op.opcodeIndex = _opcode_index(self.model, getattr(s.BuiltinOperator, name))
        op.inputs, op.outputs = [int(t) for t in inputs], [int(output)]
        if name in _OPTIONS:
            op.builtinOptionsType = getattr(s.BuiltinOptions, _OPTIONS[name])
            op.builtinOptions = getattr(s, f"{_OPTIONS[name]}T")()
        self.operators.append(op)
        return output


def _opcode_index(model, code: int) -> int:
    """The operator_codes entry of builtin `code` version 1, appended when there is none."""
    for k, opcode in enumerate(model.operatorCodes):
        if _code(opcode) == code and opcode.version == 1 and not opcode.customCode:
            return k
    s = schema()
    opcode = s.OperatorCodeT()
    opcode.builtinCode = code
    opcode.deprecatedBuiltinCode = min(code, s.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES)
    opcode.version = 1
    model.operatorCodes.append(opcode)
    return len(model.operatorCodes) - 1


def _flavour(op) -> str:
    """The flavour the catalogue says a GELU op claims by its approximate flag (no GeluOptions table reads False)."""
    approximate = bool(op.builtinOptions is not None and op.builtinOptions.approximate)
    return claimed_by(TFLITE, "GELU", {"approximate": approximate})[0].name


def _lower_subgraph(model, g: int, written_as: str | None) -> int:
    subgraph = model.subgraphs[g]
    constants: dict[str, int] = {}
    operators, lowered = [], 0
    for k, op in enumerate(subgraph.operators or []):
        if _code(model.operatorCodes[op.opcodeIndex]) != GELU:
            operators.append(op)
            continue
        x, y = int(op.inputs[0]), int(op.outputs[0])
        source = subgraph.tensors[x]
        quantized = source.quantization is not None and source.quantization.scale is not None \
            and len(source.quantization.scale) > 0
        if source.type != FLOAT32 or quantized:
            raise ValueError(f"subgraph {g} operator {k}: GELU on a {'quantized ' if quantized else ''}"
                             f"tensor of TensorType {source.type}, not float32: cannot be lowered")
        # the converter joins fused ops' names with ";": the first part names the new tensors
        name = (subgraph.tensors[y].name or b"").decode("utf-8", "replace").split(";", 1)[0] or f"gelu_{k}"
        flavour_name = written_as or _flavour(op)
        writer = _Writer(model, subgraph, constants, f"{name}/exportgate_{flavour_name}", subgraph.tensors[y])
        FORMS[flavour_name, flavour(flavour_name).no_erf_form].write(writer, x, y)
        operators.extend(writer.operators)
        lowered += 1
    subgraph.operators = operators
    return lowered


def _drop_unused_gelu_codes(model) -> None:
    used = {op.opcodeIndex for sg in model.subgraphs for op in sg.operators or []}
    keep = [k for k, opcode in enumerate(model.operatorCodes) if k in used or _code(opcode) != GELU]
    remap = {old: new for new, old in enumerate(keep)}
    model.operatorCodes = [model.operatorCodes[k] for k in keep]
    for sg in model.subgraphs:
        for op in sg.operators or []:
            op.opcodeIndex = remap[op.opcodeIndex]


def _update_min_runtime_version(model) -> None:
    for entry in model.metadata or []:
        if (entry.name or b"").decode("utf-8", "replace") != MIN_RUNTIME_VERSION_KEY:
            continue
        ops = [(builtin_name(_code(model.operatorCodes[op.opcodeIndex])), model.operatorCodes[op.opcodeIndex].version)
               for sg in model.subgraphs for op in sg.operators or []]
        version = (min_runtime_version_for(ops) or "").encode()
        buffer = model.buffers[entry.buffer]
        size = max(len(buffer.data) if buffer.data is not None else 0, len(version) + 1)
        buffer.data = np.frombuffer(version.ljust(size, b"\0"), np.uint8)


def lower_gelu_ops(content: bytes, written_as: str | None = None) -> bytes:
    """The .tflite `content` with every GELU op written as primitive builtins of its flavour, or
    of the flavour `written_as` ("relu": a RELU, which is another function: the yardstick of
    `measure --gelu-forms`).

    Raises ValueError for a GELU on a tensor that is not float32 (int8 GELU, op version 2) and
    for models whose buffers live outside the flatbuffer (> 2 GB, offset/size buffers).
    """
    model = unpack(content)
    if not any(_code(opcode) == GELU for opcode in model.operatorCodes or []):
        return bytes(content)
    if any(buffer.offset > 1 for buffer in model.buffers or []):
        raise ValueError("buffers stored outside the flatbuffer (offset/size) are not supported")
    if not sum(_lower_subgraph(model, g, written_as) for g in range(len(model.subgraphs))):
        return bytes(content)
    _drop_unused_gelu_codes(model)
    _update_min_runtime_version(model)
    return pack(model)


def set_gelu_approximate(content: bytes) -> bytes:
    """The .tflite `content` with every GELU builtin set to approximate=True (a GeluOptions table
    added where it has none): the tanh flavour, for the --gelu tanh policy. Byte for byte when
    every GELU is tanh already."""
    s = schema()
    model = unpack(content)
    if any(buffer.offset > 1 for buffer in model.buffers or []):
        raise ValueError("buffers stored outside the flatbuffer (offset/size) are not supported")
    changed = 0
    for subgraph in model.subgraphs:
        for op in subgraph.operators or []:
            if _code(model.operatorCodes[op.opcodeIndex]) == GELU and _flavour(op) != TANH:
                options = s.GeluOptionsT()
                options.approximate = _TANH_FLAG
                op.builtinOptionsType = s.BuiltinOptions.GeluOptions
                op.builtinOptions = options
                changed += 1
    return pack(model) if changed else bytes(content)
