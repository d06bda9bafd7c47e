"""Find GELU sites in an ONNX graph: fused GELU ops and the primitive chains exporters emit.

The graph becomes a neutral `chains.ChainGraph` (ONNX op names are its vocabulary; ops of
other domains are named "{domain}.{op}"), where the shared matchers find erf, tanh and sigmoid
chains and Gelu-20 nodes. The fused com.microsoft ops (Gelu, FastGelu, BiasGelu, QuickGelu)
are matched here. Only the top-level graph is searched.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper

from . import chains
from .catalogue import EXACT, QUICK_ALPHA, TANH, Site

MS_DOMAIN = "com.microsoft"


def _constant_scalar(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a one-element Constant node, else None."""
    if len(node.attribute) != 1:
        return None
    attr = node.attribute[0]
    if attr.name == "value" and math.prod(attr.t.dims) == 1:
        return numpy_helper.to_array(attr.t)
    if attr.name == "value_float":
        return np.asarray(attr.f, dtype=np.float32)
    if attr.name == "value_int":
        return np.asarray(attr.i, dtype=np.int64)
    return None


def scalar_constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """One-element initializers (stored inline) and Constant node outputs, by tensor name.

    Only scalars are read, so large weights are never converted.
    """
    out = {
        init.name: numpy_helper.to_array(init)
        for init in graph.initializer
        if math.prod(init.dims) == 1 and init.data_location != onnx.TensorProto.EXTERNAL
    }
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            value = _constant_scalar(node)
            if value is not None:
                out[node.output[0]] = value
    return out


def node_label(node: onnx.NodeProto) -> str:
    """A node's name, or its first output when it has none."""
    return node.name or node.output[0]


def _op_node(node: onnx.NodeProto) -> chains.OpNode:
    op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
    attrs = {}
    for a in node.attribute:
        value = onnx.helper.get_attribute_value(a)
        attrs[a.name] = value.decode() if isinstance(value, bytes) else value
    return chains.OpNode(node_label(node), op, tuple(node.input), tuple(node.output), attrs)


def _chain_graph(graph: onnx.GraphProto) -> chains.ChainGraph:
    return chains.ChainGraph([_op_node(n) for n in graph.node], scalar_constants(graph), [o.name for o in graph.output])


def _match_microsoft(graph: chains.ChainGraph, i: int) -> chains.Match | None:
    """com.microsoft Gelu, FastGelu, BiasGelu and QuickGelu: the kernel says the flavour."""
    node = graph.nodes[i]
    domain, _, op_type = node.op.rpartition(".")
    if domain != MS_DOMAIN:
        return None
    if op_type == "QuickGelu":
        alpha = float(node.attrs.get("alpha", QUICK_ALPHA))
        claimed = chains.sigmoid_claim(chains.close(alpha, QUICK_ALPHA, np.finfo(np.float32).eps), alpha, 1.0)
        note = f"alpha={alpha:.7g}"
    else:
        claimed, note = {
            "Gelu": (EXACT, "exact kernel"),
            "FastGelu": (TANH, "tanh kernel"),
            "BiasGelu": (EXACT, "exact kernel (onnxruntime's optimizer writes it for tanh Gelu too)"),
        }.get(op_type, (None, ""))
    if claimed is None:
        return None
    return chains.Match(node.op, claimed, frozenset({i}), node.inputs[0], node.outputs[0], note)


def find_gelu_sites(model: onnx.ModelProto) -> list[Site]:
    """Every GELU site in the model's top-level graph, in graph order.

    Relu nodes are not GELU sites; list them with `find_relu_sites`.
    """
    return chains.find_sites(_chain_graph(model.graph), _match_microsoft)


def find_relu_sites(model: onnx.ModelProto) -> list[Site]:
    """Relu nodes as sites (claimed relu), ids "relu:{index}:{node}", for the verdict step."""
    return chains.find_relu_sites(_chain_graph(model.graph), "Relu")
