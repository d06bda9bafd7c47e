"""How an ONNX model computes (verifiers.precision.Precision), read from the protobuf: QDQ,
QOperator, dynamic or float, every op on a float tensor; and its dynamic axes."""

from __future__ import annotations

from typing import Any

from verifiers.precision import FLOAT_DTYPES, FloatOp, Precision, QuantizedIO, mode_of, representable

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
    return Precision(mode_of(float_ops, float_weights, False, dynamic, integer_activations), inputs, outputs,
                     tuple(float_ops))


def onnx_dynamic_axes(model) -> list[tuple[str, int]]:
    """(input, axis) for every graph-input dimension with a dim_param or without a dim_value."""
    initializers = {t.name for t in model.graph.initializer}
    return [(v.name, axis) for v in model.graph.input if v.name not in initializers
            for axis, dim in enumerate(v.type.tensor_type.shape.dim) if not dim.HasField("dim_value")]


def onnx_input_ranges(model) -> dict[str, tuple[float, float]]:
    """The real range each float input can take once quantized, by input name: that of the
    QuantizeLinear the model applies to it first (per-tensor scale and zero point, constants)."""
    from onnx import helper, numpy_helper

    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute:
            constants[node.output[0]] = numpy_helper.to_array(helper.get_attribute_value(node.attribute[0]))
    inputs = {v.name for v in model.graph.input} - set(constants)
    ranges = {}
    for node in model.graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] not in inputs or node.input[0] in ranges:
            continue
        scale = constants.get(node.input[1])
        zero = constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if scale is None or scale.size != 1 or (zero is not None and zero.size != 1):
            continue
        dtype = zero.dtype.name if zero is not None else "uint8"
        ranges[node.input[0]] = representable(float(scale.reshape(())), int(zero.reshape(())) if zero is not None
                                              else 0, dtype)
    return ranges
