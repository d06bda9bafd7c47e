"""Find GELU sites in an ONNX graph: fused GELU ops and the primitive chains exporters emit.

The graph becomes a neutral `chain_graph.ChainGraph` (ONNX op names are its vocabulary; ops of
other domains are named "{domain}.{op}"), where the shared matchers find erf, tanh and sigmoid
chains and Gelu-20 nodes; what they miss is found by its numbers (`regions`). The fused ops the
catalogue's records claim for ONNX (com.microsoft Gelu, FastGelu, BiasGelu, QuickGelu) are matched here.

Scalar constants include what Constant, CastLike, Cast, Sqrt and other elementwise ops compute
from scalars alone (the ONNX function bodies write Gelu's constants that way). If/Loop/Scan
bodies are searched with the graph that holds them (a body's outputs count as graph outputs);
local functions are searched once inlined (`searchable`).
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from verifiers.onnx_model import DEFAULT_DOMAINS, iter_graphs, iter_nodes

from verifiers.gelu import chains
from verifiers.gelu.chain_graph import ChainGraph, Match, OpNode, close, sigmoid_claim
from verifiers.gelu.catalogue import ONNX, QUICK, QUICK_ALPHA, Site, claimed_by
from verifiers.onnx_model import constant_scalar, node_attrs, node_label, op_name, tensor_value
from verifiers.gelu.regions import ELEMENTWISE, evaluate


def _fold(node: onnx.NodeProto, out: dict[str, np.ndarray]) -> np.ndarray | None:
    """What an elementwise node computes from scalar constants alone, else None."""
    if node.domain not in DEFAULT_DOMAINS or len(node.output) != 1:
        return None
    if node.op_type == "Constant":
        return constant_scalar(node)
    if node.op_type == "CastLike" and node.input[0] in out:
        return out[node.input[0]]
    inputs = [name for name in node.input if name]
    if node.op_type not in ELEMENTWISE or not inputs or any(name not in out for name in inputs):
        return None
    attrs = _op_node(node).attrs
    first = out[inputs[0]]
    with np.errstate(all="ignore"):
        value = evaluate(node.op_type, attrs, [out[name] if name else None for name in node.input])
    dtype = attrs["to"] if node.op_type == "Cast" else first.dtype
    return np.asarray(value, dtype=dtype)


def scalar_constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """One-element initializers (stored inline), Constant node outputs and what elementwise
    nodes compute from them alone, by tensor name, in this graph and its subgraphs.

    Only scalars are read, so large weights are never converted.
    """
    values = {
        init.name: tensor_value(init)
        for g in iter_graphs(graph) for init in g.initializer
        if math.prod(init.dims) == 1 and init.data_location != onnx.TensorProto.EXTERNAL
    }
    out = {name: value for name, value in values.items() if value is not None and value.size == 1}
    for node in iter_nodes(graph):
        value = _fold(node, out)
        if value is not None and value.size == 1:
            out[node.output[0]] = value
    return out


def _op_node(node: onnx.NodeProto) -> OpNode:
    op, attrs = op_name(node), node_attrs(node)
    inputs = tuple(node.input)
    if op == "Cast":
        attrs["to"] = onnx.helper.tensor_dtype_to_np_dtype(attrs["to"])
    elif op == "CastLike":  # the target type is the second input's: read as a cast of the first
        op, inputs = "Cast", inputs[:1]
    elif op in ("If", "Loop", "Scan"):  # opaque, but it reads what its bodies return
        inputs += tuple(o.name for a in node.attribute if a.type == onnx.AttributeProto.GRAPH for o in a.g.output)
    return OpNode(node_label(node), op, inputs, tuple(node.output), attrs)


def _chain_graph(graph: onnx.GraphProto) -> ChainGraph:
    outputs = [o.name for g in iter_graphs(graph) for o in g.output]
    return ChainGraph([_op_node(n) for n in iter_nodes(graph)], scalar_constants(graph), outputs)


def searchable(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its local functions inlined (the model itself when it has none)."""
    if not model.functions:
        return model
    from onnx import inliner

    return inliner.inline_local_functions(model)


def _match_microsoft(graph: ChainGraph, i: int) -> Match | None:
    """The fused ops the catalogue lists for ONNX (com.microsoft Gelu, FastGelu, BiasGelu, QuickGelu):
    the kernel says the flavour; QuickGelu's only when its alpha is the quick flavour's."""
    node = graph.nodes[i]
    found = claimed_by(ONNX, node.op, node.attrs)
    if found is None:
        return None
    flavour, claim = found
    if flavour.name == QUICK:
        alpha = float(node.attrs.get("alpha", QUICK_ALPHA))
        claimed = sigmoid_claim(close(alpha, QUICK_ALPHA, np.finfo(np.float32).eps), alpha, 1.0)
        note = f"alpha={alpha:.7g}"
    else:
        claimed, note = flavour.name, claim.note
    if claimed is None:
        return None
    return Match(node.op, claimed, frozenset({i}), node.inputs[0], node.outputs[0], note)


def find_gelu_sites(model: onnx.ModelProto) -> list[Site]:
    """Every GELU site in the model's graph and its subgraphs, in graph order (pass the model
    through `searchable` to search its local functions too).

    Relu and SiLU nodes are not GELU sites; `find_activation_sites` lists them too.
    """
    return chains.find_sites(_chain_graph(model.graph), _match_microsoft)


def find_relu_sites(model: onnx.ModelProto) -> list[Site]:
    """Relu nodes as sites (claimed relu), ids "relu:{index}:{node}", for the verdict step."""
    return chains.find_relu_sites(_chain_graph(model.graph), "Relu")


def find_activation_sites(model: onnx.ModelProto) -> list[Site]:
    """GELU, SiLU and ReLU sites together, in graph order."""
    return chains.find_activation_sites(_chain_graph(model.graph), "Relu", _match_microsoft)
