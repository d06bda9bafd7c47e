"""Undo fusions that hide a GELU chain from the matchers, on a copy of the model.

tf2onnx's gemm rewriter turns the tanh chain's inner `x + 0.044715*x^3`, with x = MatMul(A, B), into
Gemm(A, B, x^3, beta=0.044715): it computes A@B a second time, so the chain's Add is gone and x
feeds it only through A and B. Writing such a Gemm back as Add(MatMul(A, B), beta*C) restores the
chain; the result is the same up to float rounding of the repeated product.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from verifiers.onnx_model import DEFAULT_DOMAINS

from .onnx_graph import node_attrs


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
