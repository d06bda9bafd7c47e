"""The numeric precision of an artifact, and the checks of integer devices against it.

`Precision` says how an artifact computes: its mode, its inputs' and outputs' quantization and every
op that computes on a float tensor. Modes: "float" (float32 compute), "fp16" (float16 weights),
"dynamic-int8" (int8 weights, float activations), "int8" (every compute op on int8/uint8
activations, int32 biases allowed), "int16" (16-bit activations, 8-bit weights) and "mixed"
(integer ops with some float ops left, as a quantizer leaves what it skips). Read from the
flatbuffer or the ONNX protobuf only: nothing runs, neither TensorFlow nor torch is imported.

`integer_device_incompatibilities` checks what the matrix says of integer devices (integer_only,
static_shapes, max_rank, max_inner_dims, ops) for both formats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verifiers.target_facts import Hits, Incompatibility, fact_sources, fact_text, finding_detail, locate, names_text
from verifiers.naming import shown
from verifiers.targets import Target

FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})
_SIXTEEN_BIT = frozenset({"int16", "uint16"})


@dataclass(frozen=True)
class QuantizedIO:
    """A model input or output: its dtype and, when quantized, its scale and zero point."""

    name: str
    dtype: str
    scale: float | None = None
    zero_point: int | None = None


@dataclass(frozen=True)
class FloatOp:
    """An op that computes on a float activation or weight: `tensor` is the first such input."""

    node: str
    op_type: str
    tensor: str
    dtype: str


@dataclass(frozen=True)
class Precision:
    mode: str  # "float" | "fp16" | "dynamic-int8" | "int8" | "int16" | "mixed"
    inputs: tuple[QuantizedIO, ...]
    outputs: tuple[QuantizedIO, ...]
    float_ops: tuple[FloatOp, ...]  # in graph order, from the inputs to the outputs


_QUANTIZED = frozenset({"int8", "uint8"}) | _SIXTEEN_BIT  # what quantized activations are held in


def _mode(float_ops: list[FloatOp], float_weights: set[str], int8_weights: bool, dynamic: bool,
          integer_activations: set[str]) -> str:
    """`integer_activations`: the dtypes integer ops compute on (token ids and shapes included)."""
    integer_activations = integer_activations & _QUANTIZED
    if not float_ops:
        return "int16" if integer_activations & _SIXTEEN_BIT else "int8"
    if "float16" in float_weights:
        return "fp16"
    if dynamic or int8_weights:
        return "dynamic-int8"
    return "mixed" if integer_activations else "float"


# ---- TFLite -----------------------------------------------------------------------------------------


def tflite_precision(model, labels: list[list[str]]) -> Precision:
    """The precision of a verifiers.tflite_model.TFLiteModel; `labels`: a label per op, per subgraph.

    Not float ops: a QUANTIZE of a model input and a DEQUANTIZE to a model output (the float I/O
    boundary), and a DEQUANTIZE of a constant (a float16 or int8 weight: its consumer is the float op).
    """
    main = model.subgraphs[0]
    float_ops: list[FloatOp] = []
    float_weights: set[str] = set()
    int8_weights = False
    integer_activations: set[str] = set()
    for g, sg in enumerate(model.subgraphs):
        tensors = sg.tensors

        def constant(t: int) -> bool:
            return model.buffers[tensors[t].buffer][1] > 0

        dequantized: dict[int, str] = {}  # DEQUANTIZE output -> the dtype of the constant it reads
        for op in sg.operators:
            oc = model.opcode(op)
            inputs = [t for t in op.inputs if t >= 0]
            outputs = [t for t in op.outputs if t >= 0]
            if g == 0 and oc.name == "QUANTIZE" and inputs and inputs[0] in main.inputs:
                continue
            if g == 0 and oc.name == "DEQUANTIZE" and outputs and set(outputs) <= set(main.outputs):
                continue
            if oc.name == "DEQUANTIZE" and inputs and constant(inputs[0]) and outputs:
                dequantized[outputs[0]] = tensors[inputs[0]].dtype
                continue
            weights = {t: dequantized.get(t, tensors[t].dtype) for t in inputs if constant(t) or t in dequantized}
            activations = [t for t in inputs if t not in weights]
            floating = [t for t in activations if tensors[t].dtype in FLOAT_DTYPES]
            floating += [t for t, dtype in weights.items() if dtype in FLOAT_DTYPES]
            floating += [t for t in outputs if tensors[t].dtype in FLOAT_DTYPES]
            if not floating:
                integer_activations |= {tensors[t].dtype for t in activations}
                continue
            float_weights |= {dtype for dtype in weights.values() if dtype in FLOAT_DTYPES}
            int8_weights |= any(dtype in ("int8", "uint8") for dtype in weights.values())
            tensor = tensors[floating[0]]
            float_ops.append(FloatOp(labels[g][op.index], oc.name, tensor.name, tensor.dtype))
    return Precision(_mode(float_ops, float_weights, int8_weights, False, integer_activations),
                     _tflite_io(model, "inputs"), _tflite_io(model, "outputs"), tuple(float_ops))


def _tflite_io(model, side: str) -> tuple[QuantizedIO, ...]:
    """The first signature's inputs or outputs (subgraph 0's when the file has no signature)."""
    if model.signatures:
        sd = model.signatures[0]
        sg, indices = model.subgraphs[sd.subgraph], [i for _, i in getattr(sd, side)]
    else:
        sg = model.subgraphs[0]
        indices = [i for i in getattr(sg, side) if i >= 0]
    return tuple(QuantizedIO(t.name, t.dtype, t.scale, t.zero_point) for t in (sg.tensors[i] for i in indices))


def tflite_dynamic_axes(model) -> list[tuple[str, int]]:
    """(input, axis) for every dimension -1 in a model input's shape_signature."""
    return [(io_tensor.name, axis) for io_tensor in _tflite_input_tensors(model)
            for axis, size in enumerate(io_tensor.shape_signature or ()) if size < 0]


def _tflite_input_tensors(model) -> list:
    if model.signatures:
        sd = model.signatures[0]
        return [model.subgraphs[sd.subgraph].tensors[i] for _, i in sd.inputs]
    sg = model.subgraphs[0]
    return [sg.tensors[i] for i in sg.inputs if i >= 0]


def tflite_activation_shapes(model) -> list[tuple[str, tuple[int, ...]]]:
    """(name, dims) of every tensor an op reads or writes that is not a constant (subgraph 0)."""
    sg = model.subgraphs[0]
    used = sorted({t for op in sg.operators for t in (*op.inputs, *op.outputs) if t >= 0})
    return [(sg.tensors[t].name, sg.tensors[t].dims) for t in used if model.buffers[sg.tensors[t].buffer][1] == 0]


# ---- ONNX --------------------------------------------------------------------------------------------

_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
_SHAPE_ONLY_OPS = frozenset({"Shape", "Size", "Constant"})  # read a shape, or hold a constant
# Integer kernels with float scales as inputs (QOperator format, com.microsoft quantized ops).
_QUANTIZED_OPS = frozenset({"QGemm", "QAttention", "QEmbedLayerNormalization"})
# Dynamic quantization: activations quantized at run time, the results rescaled in float.
_DYNAMIC_OPS = frozenset({"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul",
                          "MatMulIntegerToFloat", "DynamicQuantizeLSTM"})


def onnx_node_labels(model) -> list[tuple[Any, str]]:
    """(node, label) for every node, subgraphs included: its name, or op_type#index when unnamed."""
    from verifiers.onnx_model import iter_nodes

    return [(node, node.name or f"{node.op_type}#{i}") for i, node in enumerate(iter_nodes(model.graph))]


def onnx_precision(model) -> Precision:
    """The precision of an onnx.ModelProto (QDQ, QOperator, dynamic or float).

    A float op: any op but QuantizeLinear/DequantizeLinear, Shape and Size with a float input that
    no DequantizeLinear writes (a float initializer fed straight to Conv/MatMul/Gemm is an
    unquantized weight). QLinear*, QGemm and the other integer kernels are integer ops."""
    from verifiers.onnx_model import elem_types, onnx_dtype_name, op_name

    labelled = onnx_node_labels(model)
    initializers = {t.name for t in model.graph.initializer}
    names = {t for node, _ in labelled for t in (*node.input, *node.output) if t}
    names |= {v.name for v in (*model.graph.input, *model.graph.output)}
    dtypes = {name: onnx_dtype_name(t) for name, t in elem_types(model, names | initializers).items()}
    dequantized = {out for node, _ in labelled if node.op_type == "DequantizeLinear" for out in node.output}

    float_ops: list[FloatOp] = []
    float_weights: set[str] = set()
    integer_activations: set[str] = set()
    dynamic = False
    for node, label in labelled:
        if node.op_type == "QuantizeLinear":
            integer_activations |= {dtypes.get(out, "") for out in node.output[:1]}
        if node.op_type in _QDQ_OPS or node.op_type in _SHAPE_ONLY_OPS:
            continue
        dynamic |= node.op_type in _DYNAMIC_OPS
        if node.op_type.startswith("QLinear") or node.op_type in _QUANTIZED_OPS:
            integer_activations.add(dtypes.get(node.input[0], "") if node.input else "")
            continue
        floating = [t for t in node.input if t and dtypes.get(t) in FLOAT_DTYPES and t not in dequantized]
        if not floating:
            integer_activations |= {dtypes[t] for t in node.input if t in dtypes and t not in initializers}
            continue
        float_weights |= {dtypes[t] for t in floating if t in initializers}
        float_ops.append(FloatOp(label, op_name(node), floating[0], dtypes[floating[0]]))
    integer_activations -= FLOAT_DTYPES | {""}
    inputs = tuple(QuantizedIO(v.name, dtypes.get(v.name, "unknown")) for v in model.graph.input
                   if v.name not in initializers)
    outputs = tuple(QuantizedIO(v.name, dtypes.get(v.name, "unknown")) for v in model.graph.output)
    return Precision(_mode(float_ops, float_weights, False, dynamic, integer_activations), inputs, outputs,
                     tuple(float_ops))


def onnx_dynamic_axes(model) -> list[tuple[str, int]]:
    """(input, axis) for every graph-input dimension with a dim_param or without a dim_value."""
    initializers = {t.name for t in model.graph.initializer}
    return [(v.name, axis) for v in model.graph.input if v.name not in initializers
            for axis, dim in enumerate(v.type.tensor_type.shape.dim) if not dim.HasField("dim_value")]


# ---- checks --------------------------------------------------------------------------------------------


def _lead(precision: Precision) -> str:
    """'float32 model', 'float16-weight model'...: what kind of model the mode is."""
    first = precision.float_ops[0].dtype if precision.float_ops else ""
    return {"float": f"{first} model", "fp16": "float16-weight model", "dynamic-int8": "dynamic-range int8 model",
            "mixed": "partly integer model", "int16": "16-bit integer model"}.get(precision.mode, "model")


def _float_op_detail(op: FloatOp) -> dict[str, str]:
    return {"node": op.node, "op": op.op_type, "tensor": op.tensor, "dtype": op.dtype}


# The export options that write a full-integer artifact for an integer-only target, by format:
# a QDQ ONNX model keeps float inputs and outputs; an integer device's TFLite model takes int8 ones.
_INTEGER_FIX = {"onnx": "--quantize int8", "tflite": "--quantize int8 --io int8"}


def _precision_incompatibility(target: Target, precision: Precision) -> Incompatibility | None:
    requirement = (f"{target.name} runs only full-integer models with {', '.join(target.integer_dtypes)} "
                   f"activations {fact_text(target, 'integer_only', True)}")
    detail = {"mode": precision.mode, "fact": "integer_only", "integer_dtypes": list(target.integer_dtypes),
              "sources": fact_sources(target, "integer_only")}
    if precision.float_ops:
        first, n = precision.float_ops[0], len(precision.float_ops)
        message = (f"{_lead(precision)} (mode {precision.mode}): {first.op_type} at node {shown(first.node)} computes "
                   f"on {first.dtype} tensor {shown(first.tensor)}, first of {n} float op{'s' if n != 1 else ''}; "
                   f"{requirement}")
        return Incompatibility("precision", message, detail | {
            "first_float_op": _float_op_detail(first),
            "float_ops": [_float_op_detail(op) for op in precision.float_ops]}, _INTEGER_FIX[target.format])
    width = _SIXTEEN_BIT if precision.mode == "int16" else frozenset({"int8", "uint8"})
    if width & set(target.integer_dtypes):
        return None
    return Incompatibility("precision", f"{_lead(precision)} (mode {precision.mode}); {requirement}",
                           detail | {"first_float_op": None, "float_ops": []}, _INTEGER_FIX[target.format])


def integer_device_incompatibilities(target: Target, precision: Precision | None, dynamic_axes: list[tuple[str, int]],
                                     ops: list[tuple[str, str]],
                                     activations: list[tuple[str, tuple[int, ...]]] = ()) -> list[Incompatibility]:
    """What an artifact breaks of a target's integer-device facts: integer_only (against
    `precision`, None when the target claims nothing there), static_shapes (`dynamic_axes`:
    (input, axis)), ops (`ops`: (op, node) of every op) and, for `activations` ((tensor, dims)),
    max_rank and max_inner_dims."""
    out: list[Incompatibility] = []
    if target.integer_only and precision is not None:
        found = _precision_incompatibility(target, precision)
        if found is not None:
            out.append(found)
    if target.static_shapes and dynamic_axes:
        by_input: dict[str, list[int]] = {}
        for name, axis in dynamic_axes:
            by_input.setdefault(name, []).append(axis)
        if len(dynamic_axes) == 1:
            what = f"input {dynamic_axes[0][0]} axis {dynamic_axes[0][1]} is"
        else:
            what = "inputs " + ", ".join(f"{name} ({'axes' if len(axes) > 1 else 'axis'} {', '.join(map(str, axes))})"
                                         for name, axes in by_input.items()) + " are"
        out.append(Incompatibility("shape", (
            f"{what} dynamic; {target.name} takes only static shapes {fact_text(target, 'static_shapes', True)}"
        ), {"axes": [{"input": name, "axis": axis} for name, axis in dynamic_axes], "fact": "static_shapes",
            "sources": fact_sources(target, "static_shapes")}, fix=""))
    out.extend(_rank_incompatibilities(target, activations))
    if target.ops is not None:
        listed, hits = set(target.ops), Hits()
        for op, node in ops:
            if op not in listed:
                hits.add("unlisted", op, node, None)
        for group in hits.groups():
            _, where = locate(group, group["op"])
            out.append(Incompatibility("op", (
                f"{where}; {target.name} runs only the ops it lists {fact_text(target, 'ops', f'{len(listed)} ops')}"
            ), finding_detail(group, "ops", target)))
    return out


def _rank_incompatibilities(target: Target, activations) -> list[Incompatibility]:
    rules = []
    if target.max_rank is not None:
        limit = target.max_rank
        rules.append(("max_rank", limit, f"more than {limit} dimensions", lambda dims: len(dims) > limit))
    if target.max_inner_dims is not None:
        inner = target.max_inner_dims
        rules.append(("max_inner_dims", inner, f"a dimension other than 1 outside the {inner} innermost",
                      lambda dims: any(d != 1 for d in dims[:-inner])))
    out = []
    for fact, value, what, breaks in rules:
        tensors = [f"{name} {list(dims)}" for name, dims in activations if breaks(dims)]
        if tensors:
            n = len(tensors)
            out.append(Incompatibility("shape", (
                f"{n} activation tensor{'s' if n != 1 else ''} with {what} ({names_text(tensors)}); "
                f"{target.name} {fact_text(target, fact, value)}"
            ), {"tensors": tensors, "fact": fact, fact: value, "sources": fact_sources(target, fact)}))
    return out
