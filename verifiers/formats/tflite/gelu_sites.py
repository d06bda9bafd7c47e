"""Find GELU sites in a .tflite file: the GELU builtin and the primitive chains converters emit.

Subgraph 0's operators become a neutral `chain_graph.ChainGraph`: MUL, ADD, SUB, DIV, NEG, POW,
TANH, LOGISTIC (Sigmoid), RELU and GELU (approximate from GeluOptions; no options table means
approximate=False, i.e. exact, which is what onnx2tf 2.6.9 writes for a tanh GELU) map onto the
shared vocabulary; SQUARE is x*x; DEQUANTIZE of a constant is that constant (float16 weights).
MUL/ADD/SUB/DIV with a fused RELU, RELU_N1_TO_1, RELU6 or TANH read as the op followed by that
activation; an op with any other fused activation is opaque.

TFLite has no ERF builtin. litert-torch lowers torch.erf to a clamp and a rational polynomial:
z -> MINIMUM(z, 4) -> MAXIMUM(., -4) = c, s = c*c, c*P(s) / Q(s) by Horner (MUL/ADD with scalar
constants), the DIV with fused RELU_N1_TO_1 (a neutral Div then Clip to [-1, 1]). exportgate's
lowering writes erf as the sign-free Abramowitz & Stegun form (RELU/NEG/MUL/ADD/DIV/EXP/SUB: see
verifiers/formats/onnx/gelu_writer.py). Both are found by the shared recognizer, `chains.find_erf_units`,
which makes each one neutral "Erf" node, so the shared erf-chain matcher claims
0.5*x*(1+erf(x/sqrt2)) around it; a unit's RELU ops are no ReLU sites.

Ops and tensors are labelled by name when the name is unique in the subgraph (Keras and
litert-torch names carry the layer path), else "#{index}". Site ids are "{k}:{first op}";
Site.nodes lists every TFLite op of a site (the erf unit's ops included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from verifiers.tflite_model import TFLiteModel, as_model, tflite_op_labels, unique_labels

from verifiers.gelu import chains
from verifiers.gelu.chain_graph import ChainGraph, OpNode
from verifiers.gelu.catalogue import RELU, SILU, TFLITE, Site, claimed_by

SUBGRAPH = 0

_OPS = {
    "MUL": "Mul", "ADD": "Add", "SUB": "Sub", "DIV": "Div", "NEG": "Neg", "POW": "Pow", "TANH": "Tanh",
    "LOGISTIC": "Sigmoid", "RELU": "Relu", "GELU": "Gelu", "EXP": "Exp", "ABS": "Abs", "SIGN": "Sign",
    "MINIMUM": "Min", "MAXIMUM": "Max", "SQRT": "Sqrt", "LOG": "Log", "CAST": "Cast",
}
# Fused activations of elementwise ops, as the neutral op that follows them.
_FUSED_AS_NEUTRAL = {"RELU": ("Relu", {}), "RELU_N1_TO_1": ("Clip", {"min": -1.0, "max": 1.0}),
                     "RELU6": ("Clip", {"min": 0.0, "max": 6.0}), "TANH": ("Tanh", {})}
# ActivationFunctionType: NONE 0, RELU 1, RELU_N1_TO_1 2, RELU6 3, TANH 4, SIGN_BIT 5.
_ACTIVATIONS = {0: None, 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH", 5: "SIGN_BIT"}
FUSED_RELU = 1


@dataclass
class TFLiteGraph:
    """Subgraph 0 read for site matching: labels, constants, options, producers."""

    model: TFLiteModel
    op_labels: list[str]
    tensor_ids: list[str]
    names: list[str]  # op names (BuiltinOperator or custom code)
    options: list[object | None]
    constants: dict[int, np.ndarray]  # tensor index -> one-element value

    @property
    def subgraph(self):
        return self.model.subgraphs[SUBGRAPH]

    def fused_activation(self, i: int) -> int:
        return int(getattr(self.options[i], "fusedActivationFunction", 0) or 0)

    def op_index(self, label: str) -> int:
        return self.op_labels.index(label)

    def tensor_index(self, tensor_id: str) -> int:
        return self.tensor_ids.index(tensor_id)


def read_graph(model: TFLiteModel | str) -> TFLiteGraph:
    model = as_model(model)
    sg = model.subgraphs[SUBGRAPH]
    names = [model.opcode(op).name for op in sg.operators]
    op_labels = tflite_op_labels(model, SUBGRAPH)
    tensor_ids = unique_labels([t.name for t in sg.tensors])
    options = [model.options(SUBGRAPH, op.index) if op.options_type else None for op in sg.operators]
    constants: dict[int, np.ndarray] = {}
    for t, tensor in enumerate(sg.tensors):
        if tensor.buffer and math.prod(tensor.shape) == 1:
            value = model.constant(SUBGRAPH, t, max_elements=1)
            if value is not None:
                constants[t] = value
    for op, name in zip(sg.operators, names):  # DEQUANTIZE(float16 constant) keeps its precision
        if name == "DEQUANTIZE" and op.inputs and op.inputs[0] in constants and op.outputs:
            constants[op.outputs[0]] = constants[op.inputs[0]]
    return TFLiteGraph(model, op_labels, tensor_ids, names, options, constants)


# ---- neutral graph ------------------------------------------------------------------------------


def _op_node(graph: TFLiteGraph, i: int) -> list[OpNode]:
    op = graph.subgraph.operators[i]
    name, label = graph.names[i], graph.op_labels[i]
    inputs = tuple(graph.tensor_ids[t] for t in op.inputs if t >= 0)
    outputs = tuple(graph.tensor_ids[t] for t in op.outputs if t >= 0)
    activation = _ACTIVATIONS.get(graph.fused_activation(i), "?")
    if activation is not None:  # the fused activation changes what the op computes
        if name in ("MUL", "ADD", "SUB", "DIV") and activation in _FUSED_AS_NEUTRAL and len(outputs) == 1:
            act, attrs = _FUSED_AS_NEUTRAL[activation]
            before = f"{outputs[0]}#before-{activation.lower()}"
            return [OpNode(label, _OPS[name], inputs, (before,)),
                    OpNode(label, act, (before,), outputs, dict(attrs))]
        return [OpNode(label, f"{name}+{activation}", inputs, outputs)]
    if name == "CAST":
        to = _float_dtype(graph.subgraph.tensors[op.outputs[0]])
        return [OpNode(label, "Cast" if to is not None else "CAST", inputs, outputs, {"to": to})]
    if name == "SQUARE":
        return [OpNode(label, "Mul", (inputs[0], inputs[0]), outputs)]
    if name == "GELU":  # no GeluOptions table reads as approximate=False
        flavour, _ = claimed_by(TFLITE, name, {"approximate": bool(getattr(graph.options[i], "approximate", False))})
        attrs = {"approximate": flavour.gelu20_approximate, "has_options": graph.options[i] is not None}
        return [OpNode(label, "Gelu", inputs, outputs, attrs)]
    return [OpNode(label, _OPS.get(name, name), inputs, outputs)]


def _float_dtype(tensor) -> np.dtype | None:
    """The numpy dtype of a float tensor that is not quantized, else None."""
    if tensor.dtype in ("float16", "float32", "float64") and not tensor.quantized:
        return np.dtype(tensor.dtype)
    return None


def chain_graph(graph: TFLiteGraph) -> ChainGraph:
    """The neutral graph of subgraph 0."""
    nodes = [node for i in range(len(graph.subgraph.operators)) for node in _op_node(graph, i)]
    constants = {graph.tensor_ids[t]: np.asarray(v).reshape(-1) for t, v in graph.constants.items()}
    outputs = [graph.tensor_ids[t] for t in graph.subgraph.outputs if t >= 0]
    dtypes = {graph.tensor_ids[t]: dtype for t, tensor in enumerate(graph.subgraph.tensors)
              if (dtype := _float_dtype(tensor)) is not None}
    return ChainGraph(nodes, constants, outputs, dtypes)


@dataclass(frozen=True)
class ErfUnit:
    """An erf written out in subgraph 0 (see `chains.find_erf_units`): its op indices, graph order, and
    its max |unit(z) - erf(z)| on [-6, 6] in float64."""

    ops: tuple[int, ...]
    error: float


def find_erf_units(graph: TFLiteGraph) -> list[ErfUnit]:
    """The erf units of subgraph 0 (litert-torch's clamp + rational polynomial, exportgate's A&S form), graph order."""
    neutral = chain_graph(graph)
    order = {label: i for i, label in enumerate(graph.op_labels)}
    return [ErfUnit(tuple(sorted({order[neutral.nodes[j].name] for j in unit.nodes})), unit.error)
            for unit in chains.find_erf_units(neutral)]


def _finish(graph: TFLiteGraph, site: Site) -> Site:
    """TFLite names (GELU and its options), Site.nodes in graph order."""
    order = {label: i for i, label in enumerate(graph.op_labels)}
    labels = sorted(site.nodes, key=order.__getitem__)
    if site.op != "Gelu":
        return replace(site, nodes=tuple(labels))
    options = graph.options[order[labels[0]]]
    note = ("no GeluOptions table: approximate=False (exact)" if options is None
            else f"GeluOptions approximate={bool(options.approximate)}")
    return replace(site, op="GELU", nodes=tuple(labels), note=note)


def relu_sites(graph: TFLiteGraph) -> list[Site]:
    """RELU ops and RELU activations fused into another op (FULLY_CONNECTED, CONV_2D, ADD...).

    Both are shown as op "Relu" (what the verdict and `inspect` treat as a ReLU site); the note
    names the op a fused ReLU lives in. ids "relu:{k}:{op}".
    """
    sites = []
    sg = graph.subgraph
    in_units = {graph.op_labels[i] for unit in find_erf_units(graph) for i in unit.ops}
    for i, op in enumerate(sg.operators):
        if not op.outputs or op.outputs[0] < 0 or graph.op_labels[i] in in_units:
            continue
        out = graph.tensor_ids[op.outputs[0]]
        label = graph.op_labels[i]
        if graph.names[i] == "RELU":
            sites.append((label, graph.tensor_ids[op.inputs[0]], out, "RELU op"))
        elif graph.fused_activation(i) == FUSED_RELU:
            sites.append((label, out, out, f"RELU fused into {graph.names[i]}"))
    return [Site(f"relu:{k}:{label}", "Relu", RELU, (label,), src, out, note)
            for k, (label, src, out, note) in enumerate(sites)]


def _gelu_sites(graph: TFLiteGraph) -> list[Site]:
    return [s for s in measured_sites(graph) if s.claimed != SILU]


def measured_sites(graph: TFLiteGraph) -> list[Site]:
    """GELU and SiLU sites of subgraph 0 (what the inventory probes), graph order."""
    return [_finish(graph, s) for s in chains.find_measured_sites(chain_graph(graph))]


def find_tflite_sites(model: TFLiteModel | str) -> list[Site]:
    """Every GELU site of subgraph 0, in graph order (ids "{k}:{first op}")."""
    return _gelu_sites(read_graph(model))


def find_tflite_relu_sites(model: TFLiteModel | str) -> list[Site]:
    return relu_sites(read_graph(model))


def tflite_activation_sites(model: TFLiteModel | str) -> list[Site]:
    """GELU, SiLU and ReLU sites together, in graph order (what the GELU verdict aligns)."""
    graph = read_graph(model)
    order = {label: i for i, label in enumerate(graph.op_labels)}
    sites = measured_sites(graph) + relu_sites(graph)
    return sorted(sites, key=lambda s: min(order[label] for label in s.nodes))

