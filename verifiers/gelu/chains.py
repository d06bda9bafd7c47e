"""GELU site finding on a neutral graph, shared by the ONNX, PyTorch and Keras site finders.

The neutral graph (`OpNode`, `ChainGraph`), its vocabulary and the chain templates that match
erf, tanh and sigmoid chains and one-node Gelus are in `chain_graph`. This module holds the entry
points that run them and the erf units they see through. The templates name what they find;
their nodes are then evaluated on the probes, and where the numbers are conclusive they claim the
flavour (and its scale: 0.6*x*(1+erf(x/sqrt2)) is 1.2 x exact); else the structure does,
constants that do not match the catalogue making the claim `unknown`. Whatever the templates miss
is found by its numbers (`regions`).

Erf units: a target without an erf op (old TFLite runtimes, delegates) gets erf written out,
e.g. as exportgate's sign-free Abramowitz & Stegun 7.1.26 form erf(z) = q(relu(-z)) - q(relu(z)),
q(u) = (a1 t + ... + a5 t^5) exp(-u^2), t = 1/(1 + p u), or as litert-torch's clamp and rational
polynomial (z clamped to [-4, 4] by Min/Max, c*P(c^2)/Q(c^2), the result clipped to [-1, 1]).
`find_erf_units` finds such units: from a tensor z read by Relu, Abs or a clamp (or by Neg then
Relu), the elementwise ops (Mul, Add, Sub, Div, Neg, Exp, Relu, Abs, Min, Max, Clip) computable
from z and scalar constants alone are evaluated in float64 on [-6, 6]; the first tensor among them
within ERF_UNIT_TOLERANCE of erf(z) (or twice the machine epsilon of the coarsest constant read:
float16 constants put A&S 7e-4 from erf), taken on through ops that still compute erf from it
(the final clip), whose ops leave nothing else to the rest of the graph, is an erf unit.
`find_sites` and `find_relu_sites` see each unit as one neutral "Erf" node (so the erf-chain
matcher claims the GELU around it, and a unit's Relus are no ReLU sites); a site lists every node
of its units.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .catalogue import RELU, SILU, Site, erf
from .chain_graph import ChainGraph, Match, OpNode
from .regions import RegionFinder, evaluate


# ---- erf units -----------------------------------------------------------------------------

_CLAMPS = ("Min", "Max", "Clip")
_UNARY_UNIT_OPS = ("Neg", "Exp", "Relu", "Abs")
ERF_UNIT_OPS = ("Mul", "Add", "Sub", "Div", *_UNARY_UNIT_OPS, *_CLAMPS)
ERF_UNIT_TOLERANCE = 1e-5  # exportgate's A&S unit is within 1.5e-7 of erf; litert-torch's rational one ~1e-6
_MAX_UNIT_NODES = 96
_UNIT_GRID = np.linspace(-6.0, 6.0, 481)
_UNIT_ERF = erf(_UNIT_GRID)
UNIT_LABELS = "unit_labels"  # attrs key of a collapsed unit's neutral Erf node: its nodes' labels
UNIT_FORM = "unit_form"  # attrs key of a collapsed unit's neutral Erf node: how the unit writes erf


@dataclass(frozen=True)
class ErfUnit:
    """An erf written out in elementwise ops: node indices (graph order), z, erf(z), max error.

    clamped: the unit clamps z (Min/Max/Clip), as a rational approximation does."""

    nodes: tuple[int, ...]
    input: str
    output: str
    error: float
    clamped: bool = False

    @property
    def form(self) -> str:
        return "as a clamp + rational polynomial" if self.clamped else "written out"


def _unit_roots(graph: ChainGraph) -> list[str]:
    """Tensors an erf unit may start from: read by Relu, Abs or a clamp, or by a Neg whose output a Relu reads."""
    roots: list[str] = []
    for node in graph.nodes:
        if node.op in ("Relu", "Abs", *_CLAMPS) and node.inputs:
            roots.append(node.inputs[0])
            j = graph.producer.get(node.inputs[0])
            if node.op == "Relu" and j is not None and graph.nodes[j].op == "Neg":
                roots.append(graph.nodes[j].inputs[0])
    return list(dict.fromkeys(roots))


def _forward_closure(graph: ChainGraph, root: str) -> list[int]:
    """Unit ops computable from root and scalar constants alone (at most _MAX_UNIT_NODES), graph order."""
    known, closure, queue = {root}, set(), [root]
    while queue and len(closure) < _MAX_UNIT_NODES:
        for i in graph.consumers.get(queue.pop(), []):
            node = graph.nodes[i]
            if i in closure or node.op not in ERF_UNIT_OPS or len(node.outputs) != 1:
                continue
            if all(t in known or graph.scalar(t) is not None for t in node.inputs):
                closure.add(i)
                known.add(node.outputs[0])
                queue.append(node.outputs[0])
    return sorted(closure)


def _arity_ok(op: str, count: int) -> bool:
    if op in _UNARY_UNIT_OPS:
        return count == 1
    return 1 <= count <= 3 if op == "Clip" else count == 2


def _erf_unit(graph: ChainGraph, root: str) -> ErfUnit | None:
    """The unit from root: the first tensor of the closure (graph order) within tolerance of erf, taken
    on through the ops that still compute erf from it alone (a clamp of the result to [-1, 1])."""
    closure = _forward_closure(graph, root)
    if not any(graph.nodes[i].op in ("Exp", *_CLAMPS) for i in closure):
        return None
    values = {root: _UNIT_GRID}
    found, eps = None, 0.0
    with np.errstate(all="ignore"):
        for i in closure:
            node = graph.nodes[i]
            args = []
            for t in node.inputs:
                if t in values:
                    args.append(values[t])
                else:
                    const = graph.scalar(t)
                    args.append(const.coeff)
                    eps = max(eps, const.eps)
            if not _arity_ok(node.op, len(args)):
                if found is None:
                    return None
                continue
            out = np.broadcast_to(np.asarray(evaluate(node.op, node.attrs, args), dtype=np.float64), _UNIT_GRID.shape)
            values[node.outputs[0]] = out
            # constants stored in float16 (eps 1e-3) put A&S 7e-4 from erf
            if found is None and _erf_error(out) <= max(ERF_UNIT_TOLERANCE, 2.0 * eps):  # NaN compares false
                found = i
    if found is None:
        return None
    output = graph.nodes[found].outputs[0]
    inside = set(closure)
    while (j := graph.sole_consumer(output)) is not None and j in _ops_reading_only(graph, output) & inside:
        out = values.get(graph.nodes[j].outputs[0])
        if out is None or not _erf_error(out) <= max(ERF_UNIT_TOLERANCE, 2.0 * eps):
            break
        output = graph.nodes[j].outputs[0]
    error = _erf_error(values[output])
    cone = graph.cone(output, inside)
    if graph.leaks(cone, output):  # only the erf leaves the unit
        return None
    return ErfUnit(tuple(sorted(cone)), root, output, error, any(graph.nodes[k].op in _CLAMPS for k in cone))


def _erf_error(values: np.ndarray) -> float:
    return float(np.max(np.abs(values - _UNIT_ERF)))


def _ops_reading_only(graph: ChainGraph, tensor: str) -> set[int]:
    """Consumers of `tensor` whose other inputs are scalar constants."""
    return {i for i in graph.consumers.get(tensor, [])
            if all(t == tensor or graph.scalar(t) is not None for t in graph.nodes[i].inputs)}


def find_erf_units(graph: ChainGraph) -> list[ErfUnit]:
    """Erf written out in elementwise ops on scalar constants (see the module docstring), graph order."""
    units: list[ErfUnit] = []
    taken: set[int] = set()
    for root in _unit_roots(graph):
        unit = _erf_unit(graph, root)
        if unit is not None and not taken & set(unit.nodes):
            units.append(unit)
            taken |= set(unit.nodes)
    return sorted(units, key=lambda u: u.nodes[0])


def with_erf_units(graph: ChainGraph) -> ChainGraph:
    """The graph with each erf unit as one neutral Erf node (where its last node stood), labelled by
    its first node, attrs[UNIT_LABELS] naming all its nodes; the graph itself when there is none."""
    units = find_erf_units(graph)
    if not units:
        return graph
    last = {u.nodes[-1]: u for u in units}
    inside = {i for u in units for i in u.nodes}
    nodes = []
    for i, node in enumerate(graph.nodes):
        unit = last.get(i)
        if unit is not None:
            labels = tuple(dict.fromkeys(graph.nodes[j].name for j in unit.nodes))
            nodes.append(OpNode(labels[0], "Erf", (unit.input,), (unit.output,),
                                {UNIT_LABELS: labels, UNIT_FORM: unit.form, "error": unit.error}))
        elif i not in inside:
            nodes.append(node)
    return ChainGraph(nodes, graph.constants, graph.graph_outputs, graph.dtypes)


def _unit_note(graph: ChainGraph, match: Match) -> str:
    units = [graph.nodes[j].attrs for j in sorted(match.nodes) if UNIT_LABELS in graph.nodes[j].attrs]
    notes = [f"erf {a[UNIT_FORM]} ({len(a[UNIT_LABELS])} ops, {a['error']:.1g} from erf)" for a in units]
    return "; ".join([match.note, *notes]) if notes else match.note


Matcher = Callable[[ChainGraph, int], Match | None]

_MATCHERS: dict[str, Matcher] = {
    "Erf": ChainGraph.match_erf,
    "Tanh": ChainGraph.match_tanh,
    "Sigmoid": ChainGraph.match_sigmoid,
    "Gelu": ChainGraph.match_gelu,
}


def find_sites(graph: ChainGraph, fused: Matcher | None = None) -> list[Site]:
    """Every GELU site of a neutral graph, in graph order, ids "{k}:{first node}".

    fused matches the adapter's own one-node ops (tried on nodes no shared matcher takes). A
    source node expanded into several neutral nodes (TF's Erfc) is listed once. Erf units
    (`find_erf_units`) are matched as one Erf; a site lists all their nodes, in graph order.
    What the templates miss is found by its numbers (`regions`): op "elementwise", claimed the
    flavour it computes. Sites no graph output depends on are marked unused.
    """
    return [s for s in find_measured_sites(graph, fused) if s.claimed != SILU]


def find_silu_sites(graph: ChainGraph, fused: Matcher | None = None) -> list[Site]:
    """SiLU sites (x*sigmoid(x), found by their numbers), ids "silu:{k}:{first node}"."""
    return [s for s in find_measured_sites(graph, fused) if s.claimed == SILU]


def _measured(finder, match: Match) -> Match:
    """A template's match claimed by what its nodes compute, when the numbers are conclusive (a
    hand-written formula is whatever it computes, e.g. 2 x GELU); else by its structure."""
    c = finder.measure(match.nodes, match.input, match.output)
    if c is None or not c.confident or (c.flavour == match.claimed and c.scale == 1.0):
        return match
    return replace(match, claimed=c.flavour, scale=c.scale, note=f"{match.note}; its numbers: {c.note}")


def find_measured_sites(graph: ChainGraph, fused: Matcher | None = None) -> list[Site]:
    """GELU and SiLU sites together, graph order: the sites an artifact's inventory measures."""
    order = {node.name: i for i, node in reversed(list(enumerate(graph.nodes)))}
    graph = with_erf_units(graph)
    matches: list[Match] = []
    covered: set[int] = set()
    for i, node in enumerate(graph.nodes):
        matcher = _MATCHERS.get(node.op, fused)
        if i in covered or matcher is None:
            continue
        match = matcher(graph, i)
        if match is not None and not (match.nodes & covered):
            matches.append(match)
            covered |= match.nodes
    finder = RegionFinder(graph)
    matches = [_measured(finder, m) for m in matches]
    for region in finder.sites(covered):
        c = region.classification
        matches.append(Match("elementwise", c.flavour, region.nodes, region.input, region.output,
                             f"found by its numbers: {c.note}", c.scale))
    matches.sort(key=lambda m: min(m.nodes))
    live = graph.live_tensors()
    sites, counts = [], {"": 0, SILU: 0}
    for m in matches:
        labels = [label for j in sorted(m.nodes)
                  for label in graph.nodes[j].attrs.get(UNIT_LABELS, (graph.nodes[j].name,))]
        labels = tuple(sorted(dict.fromkeys(labels), key=lambda label: order.get(label, len(order))))
        kind = SILU if m.claimed == SILU else ""
        site_id = f"{kind + ':' if kind else ''}{counts[kind]}:{labels[0]}"
        counts[kind] += 1
        sites.append(Site(site_id, m.op, m.claimed, labels, m.input, m.output, _unit_note(graph, m),
                          m.scale, m.output in live, graph.absorbing_consumers(m.output)))
    return sites


def find_relu_sites(graph: ChainGraph, op: str) -> list[Site]:
    """Relu nodes as sites (claimed relu, shown as `op`), ids "relu:{index}:{node}" (a Relu inside
    an erf unit is none)."""
    graph = with_erf_units(graph)
    live = graph.live_tensors()
    relus = [n for n in graph.nodes if n.op == "Relu"]
    return [
        Site(f"relu:{k}:{n.name}", op, RELU, (n.name,), n.inputs[0], n.outputs[0], used=n.outputs[0] in live)
        for k, n in enumerate(relus)
    ]


def find_activation_sites(graph: ChainGraph, relu_op: str, fused: Matcher | None = None) -> list[Site]:
    """GELU, SiLU and ReLU sites together, in graph order (what the GELU verdict aligns)."""
    order = {node.name: i for i, node in reversed(list(enumerate(graph.nodes)))}
    sites = find_measured_sites(graph, fused) + find_relu_sites(graph, relu_op)
    return sorted(sites, key=lambda s: min(order[label] for label in s.nodes))
