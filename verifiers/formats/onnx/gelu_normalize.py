"""Undo fusions and quantization steps that hide a GELU chain from the matchers, on a copy of the model.

tf2onnx's gemm rewriter turns the tanh chain's inner `x + 0.044715*x^3`, with x = MatMul(A, B), into
Gemm(A, B, x^3, beta=0.044715): it computes A@B a second time, so the chain's Add is gone and x
feeds it only through A and B. Writing such a Gemm back as Add(MatMul(A, B), beta*C) restores the
chain; the result is the same up to float rounding of the repeated product. QDQ quantization
interleaves QuantizeLinear/DequantizeLinear pairs with an erf chain's ops: `read_through_qdq`
reads through them and keeps the 8-bit grids they round to.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from verifiers.onnx_model import DEFAULT_DOMAINS

from verifiers.gelu.int8 import RANGES, Int8Grid
from verifiers.onnx_model import node_attrs


def split_duplicate_gemms(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with every Gemm(A, B, C) whose A@B an earlier MatMul already computes
    rewritten as Add(that MatMul, Mul(C, beta)); the model itself when there is none."""
    graph = model.graph
    products: dict[tuple[str, str], str] = {}
    rewrites: dict[int, list[onnx.NodeProto]] = {}
    weight_types = {init.name: init.data_type for init in graph.initializer}
    for i, node in enumerate(graph.node):
        if node.domain not in DEFAULT_DOMAINS:
            continue
        if node.op_type == "MatMul":
            products.setdefault((node.input[0], node.input[1]), node.output[0])
        elif node.op_type == "Gemm" and len(node.input) == 3:
            attrs = node_attrs(node)
            product = products.get((node.input[0], node.input[1]))
            if product is None or attrs.get("transA", 0) or attrs.get("transB", 0) or attrs.get("alpha", 1.0) != 1.0:
                continue
            dtype = helper.tensor_dtype_to_np_dtype(weight_types.get(node.input[1], onnx.TensorProto.FLOAT))
            beta = numpy_helper.from_array(np.array(attrs.get("beta", 1.0), dtype=dtype), f"{node.name}/beta")
            rewrites[i] = [
                helper.make_node("Constant", [], [beta.name], name=f"{node.name}/beta", value=beta),
                helper.make_node("Mul", [node.input[2], beta.name], [f"{node.name}/scaled"], name=f"{node.name}/mul"),
                helper.make_node("Add", [product, f"{node.name}/scaled"], list(node.output), name=f"{node.name}/add"),
            ]
    if not rewrites:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    nodes = [new for i, node in enumerate(graph.node) for new in rewrites.get(i, [node])]
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy


def read_through_qdq(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, Int8Grid]]:
    """A copy of `model` with its per-tensor QuantizeLinear -> DequantizeLinear pairs (QDQ
    quantization: onnxruntime's quantize_static) read as the float tensor they quantize, and
    every DequantizeLinear of a one-element constant as that constant (float32); with, for each
    tensor such a pair quantized, the 8-bit output grid it is rounded to. The model itself and {}
    when it has no such pair.

    The float ops between the pairs (a Gelu, or an erf chain quantize_static interleaved with
    requantizations) then form one site, measured in float: the requantizations are numeric
    error, not a flavour. A pair whose DequantizeLinear output is a graph output is kept.
    """
    graph = model.graph
    values = {init.name: init for init in graph.initializer}
    consumers: dict[str, list[int]] = {}
    for i, node in enumerate(graph.node):
        for name in node.input:
            consumers.setdefault(name, []).append(i)
    outputs = {o.name for o in graph.output}
    renamed: dict[str, str] = {}  # DequantizeLinear output -> the float tensor it stands for
    dropped: set[int] = set()
    grids: dict[str, Int8Grid] = {}
    constants: list[onnx.TensorProto] = []
    for i, node in enumerate(graph.node):
        quant = _per_tensor(node, values)
        if quant is None:
            continue
        scale, zero = quant
        if node.op_type == "DequantizeLinear":
            constant = values.get(node.input[0])
            # Only a one-element constant is read: a weight may be left unread in its file
            # (verifiers.onnx_wire.read_without_weights), and it stays a DequantizeLinear.
            if constant is not None and int(np.prod(constant.dims)) == 1 and node.output[0] not in outputs:
                value = (numpy_helper.to_array(constant).astype(np.float64) - float(zero)) * float(scale)
                constants.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
                dropped.add(i)
            continue
        dqs = consumers.get(node.output[0], [])
        dtype = zero.dtype.name
        if (dtype not in RANGES or not dqs or node.output[0] in outputs
                or any(graph.node[j].op_type != "DequantizeLinear" or _per_tensor(graph.node[j], values) != quant
                       or graph.node[j].output[0] in outputs for j in dqs)):
            continue
        grids[node.input[0]] = Int8Grid(dtype, float(scale), int(zero))
        dropped.update((i, *dqs))
        renamed.update({graph.node[j].output[0]: node.input[0] for j in dqs})
    if not dropped:
        return model, {}
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.graph.node[:]
    for i, node in enumerate(graph.node):
        if i not in dropped:
            new = copy.graph.node.add()
            new.CopyFrom(node)
            new.input[:] = [renamed.get(name, name) for name in node.input]
    copy.graph.initializer.extend(constants)
    return copy, grids


def _per_tensor(node: onnx.NodeProto, values: dict[str, onnx.TensorProto]) -> tuple[np.ndarray, np.ndarray] | None:
    """A default-domain Quantize/DequantizeLinear's scale and zero point when both are one-element
    initializers, else None."""
    if node.domain not in DEFAULT_DOMAINS or node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
        return None
    if len(node.input) < 3 or node.input[1] not in values or node.input[2] not in values:
        return None
    scale, zero = (numpy_helper.to_array(values[name]).reshape(-1) for name in node.input[1:3])
    if scale.size != 1 or zero.size != 1:
        return None
    return scale[0], zero[0]
