"""Small readers of ONNX graphs shared by the GELU site finder, the probes and the writer."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper

from verifiers.onnx_model import DEFAULT_DOMAINS


def node_label(node: onnx.NodeProto) -> str:
    """A node's name, or its first output when it has none (how sites name their nodes)."""
    return node.name or (node.output[0] if node.output else node.op_type)


def op_name(node: onnx.NodeProto) -> str:
    """The op type, as "{domain}.{op_type}" outside the default domain."""
    return node.op_type if node.domain in DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"


def node_attrs(node: onnx.NodeProto) -> dict:
    """A node's attributes by name (strings decoded; subgraph attributes left out)."""
    attrs = {}
    for a in node.attribute:
        if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            continue
        value = onnx.helper.get_attribute_value(a)
        attrs[a.name] = value.decode() if isinstance(value, bytes) else value
    return attrs


def tensor_value(tensor: onnx.TensorProto) -> np.ndarray | None:
    """A tensor's value, or None for one numpy cannot hold (a data type this onnx does not know,
    data that does not match its dims: hostile files pass onnx.checker with both)."""
    try:
        return numpy_helper.to_array(tensor)
    except (KeyError, ValueError, TypeError):
        return None


def constant_scalar(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a one-element Constant node, else None."""
    if len(node.attribute) != 1:
        return None
    attr = node.attribute[0]
    if attr.name == "value" and math.prod(attr.t.dims) == 1:
        return tensor_value(attr.t)
    if attr.name == "value_float":
        return np.asarray(attr.f, dtype=np.float32)
    if attr.name == "value_int":
        return np.asarray(attr.i, dtype=np.int64)
    return None


def subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name read by nodes of the graph's subgraphs (If/Loop/Scan bodies, nested)."""
    names: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                names.update(i for n in sub.node for i in n.input)
                names |= subgraph_reads(sub)
    return names
