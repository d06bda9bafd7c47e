"""Elementwise regions: structure proposes candidate activation sites, the numbers decide.

A region is what a neutral graph computes elementwise from one variable tensor (its root): the
ops of `ELEMENTWISE` whose every input is the root, a tensor the region already computes, or a
scalar constant. A region that holds a nonlinearity (`NONLINEAR`) is evaluated on the catalogue's
probes, core and tails, in float64 rounded to each tensor's dtype where the graph gives one, and
every tensor it computes is classified. The last tensor (graph order) that computes a GELU
flavour, a GELU-shaped unknown curve or a SiLU, possibly times a constant scale, and whose
intermediate tensors leave nothing to the rest of the graph, is a site; trailing Casts are left
out of the site when the tensor before them is one too (a float16 model that upcasts around its
GELU: the site is the float32 computation). The search then goes on in what is left, so a region holds any number of sites.

The templates in `chain_graph` stay the fast path that names what they find (erf-chain, Gelu); any
spelling they miss (a clamped tanh argument, erf(x/1.414213562) written with Erfc, a Sum of
terms, ops wrapped in casts) is found here by what it computes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .catalogue import GELU_FAMILY, SILU, UNKNOWN, erf, flavour, gelu20_flavour
from .classification import FLOAT16_TOLERANCE, FLOAT32_TOLERANCE, Classification, classify, probe_inputs


def _clip(node_attrs: dict, x, *bounds):
    low = bounds[0] if len(bounds) > 0 and bounds[0] is not None else node_attrs.get("min")
    high = bounds[1] if len(bounds) > 1 and bounds[1] is not None else node_attrs.get("max")
    return np.clip(x, -np.inf if low is None else low, np.inf if high is None else high)


def _gelu(node_attrs: dict, x):
    approximate = node_attrs.get("approximate", "none")
    name = gelu20_flavour(approximate)
    if name is None:
        raise ValueError(f"Gelu approximate={approximate!r}")
    return flavour(name).reference(x)


# Neutral op -> its float64 function (attrs first for the ops that read attributes).
_UNARY: dict[str, Callable] = {
    "Neg": np.negative, "Erf": erf, "Tanh": np.tanh, "Sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)),
    "Exp": np.exp, "Relu": lambda v: np.maximum(v, 0.0), "Abs": np.abs, "Sign": np.sign, "Sqrt": np.sqrt,
    "Reciprocal": lambda v: 1.0 / v, "Log": np.log, "Softplus": lambda v: np.logaddexp(0.0, v),
    "Identity": lambda v: v, "Cast": lambda v: v, "Silu": lambda v: v / (1.0 + np.exp(-v)),
}
_BINARY: dict[str, Callable] = {
    "Mul": np.multiply, "Div": np.divide, "Add": np.add, "Sub": np.subtract, "Pow": np.power,
}
_VARIADIC: dict[str, Callable] = {
    "Sum": lambda *a: sum(a[1:], a[0]), "Min": lambda *a: np.minimum.reduce(np.broadcast_arrays(*a)),
    "Max": lambda *a: np.maximum.reduce(np.broadcast_arrays(*a)),
}
_WITH_ATTRS: dict[str, Callable] = {"Clip": _clip, "Gelu": _gelu}
ELEMENTWISE = frozenset([*_UNARY, *_BINARY, *_VARIADIC, *_WITH_ATTRS])
NONLINEAR = frozenset(["Erf", "Tanh", "Sigmoid", "Exp", "Relu", "Softplus", "Log", "Gelu", "Silu"])
_MAX_REGION_NODES = 128
_FLOAT32_EPS = float(np.finfo(np.float32).eps)


def evaluate(op: str, attrs: dict, args: list) -> np.ndarray:
    """One neutral elementwise op on float64 arrays or scalars."""
    if op in _UNARY:
        return _UNARY[op](args[0])
    if op in _BINARY:
        return _BINARY[op](args[0], args[1])
    if op in _VARIADIC:
        return _VARIADIC[op](*args)
    return _WITH_ATTRS[op](attrs, *args)


@dataclass(frozen=True)
class RegionSite:
    """A site found by the numbers: node indices, root and output tensors, what it computes."""

    nodes: frozenset[int]
    input: str
    output: str
    classification: Classification


def _is_site(c: Classification) -> bool:
    if c.flavour in GELU_FAMILY or c.flavour == SILU:
        return True
    return c.flavour == UNKNOWN and c.confident  # GELU-shaped off the curves, or a broken tail


def _tolerance(dtype: np.dtype | None) -> float:
    return FLOAT16_TOLERANCE if dtype is not None and np.dtype(dtype) == np.float16 else FLOAT32_TOLERANCE


def _classify(values: dict, dtypes: dict, root: str, tensor: str) -> Classification:
    """What `tensor` computes from the probes at `root`, at the precision of its dtype."""
    return classify(values[root].astype(dtypes[root]), values[tensor].astype(dtypes[tensor] or np.float64),
                    _tolerance(dtypes[tensor]))


class RegionFinder:
    """Finds the region sites of a ChainGraph (see the module docstring)."""

    def __init__(self, graph):
        self.graph = graph

    def _closure(self, root: str, taken: set[int]) -> list[int]:
        graph = self.graph
        known, closure, queue = {root}, set(), [root]
        while queue and len(closure) < _MAX_REGION_NODES:
            for i in graph.consumers.get(queue.pop(), []):
                node = graph.nodes[i]
                if i in closure or i in taken or node.op not in ELEMENTWISE or len(node.outputs) != 1:
                    continue
                if all(not t or t in known or graph.scalar(t) is not None for t in node.inputs):
                    closure.add(i)
                    known.add(node.outputs[0])
                    queue.append(node.outputs[0])
        return sorted(closure)

    def _dtype(self, tensor: str, node=None, inherited: np.dtype | None = None) -> np.dtype | None:
        dtype = self.graph.dtypes.get(tensor)
        if dtype is None and node is not None and node.op == "Cast":
            dtype = node.attrs.get("to")
        if dtype is None:
            dtype = inherited
        return None if dtype is None else np.dtype(dtype)

    def _evaluate(self, root: str, closure: list[int]):
        """Values and dtypes of every tensor the closure computes from the probes at root."""
        graph = self.graph
        root_dtype = self._dtype(root) or np.dtype(np.float32)
        if root_dtype.kind != "f":
            return None, None
        x = probe_inputs(root_dtype).astype(np.float64)
        values, dtypes = {root: x}, {root: root_dtype}
        with np.errstate(all="ignore"):
            for i in closure:
                node = graph.nodes[i]
                args, inherited = [], None
                for t in node.inputs:
                    const = None if not t or t in values else graph.scalar(t)
                    if not t:
                        args.append(None)
                    elif t in values:
                        args.append(values[t])
                        inherited = inherited or dtypes[t]
                    elif const is not None:
                        args.append(const.coeff)
                    else:  # computed by a node left unevaluated (an integer intermediate)
                        break
                if len(args) != len(node.inputs):
                    continue
                out_name = node.outputs[0]
                dtype = self._dtype(out_name, node, inherited)
                if dtype is not None and dtype.kind != "f":
                    continue  # integer or boolean intermediates end the evaluation there
                value = np.asarray(evaluate(node.op, node.attrs, args), dtype=np.float64)
                value = np.broadcast_to(value, x.shape)
                if dtype is not None:
                    value = value.astype(dtype).astype(np.float64)
                values[out_name], dtypes[out_name] = value, dtype
        return values, dtypes

    def _pick(self, root: str, closure: list[int], values, dtypes, taken: set[int]) -> RegionSite | None:
        graph = self.graph
        inside = set(closure)
        for i in reversed(closure):
            if i in taken:
                continue
            out = graph.nodes[i].outputs[0]
            if out not in values:
                continue
            c = _classify(values, dtypes, root, out)
            if not _is_site(c):
                continue
            cone = graph.cone(out, inside)
            if cone & taken or not any(graph.nodes[j].op in NONLINEAR for j in cone) or graph.leaks(cone, out):
                continue
            while (node := graph.nodes[graph.producer[out]]).op == "Cast" and node.inputs[0] in values \
                    and node.inputs[0] != root:  # casts around a site are its boundary, not its computation
                inner = node.inputs[0]
                ci = _classify(values, dtypes, root, inner)
                if not _is_site(ci):
                    break
                cone, out, c = cone - {graph.producer[out]}, inner, ci
            return RegionSite(frozenset(cone), root, out, c)
        return None

    def measure(self, nodes: frozenset[int], root: str, output: str) -> Classification | None:
        """What the given nodes compute from root to output on the probes, or None when the numbers
        cannot decide: a node is no elementwise op the evaluator knows (a fused kernel), reads
        another tensor, or computes below float32 (float16 / bfloat16 constants or tensors, where
        the flavours are closer than the rounding)."""
        graph = self.graph
        order = sorted(nodes)
        if any(graph.nodes[i].op not in ELEMENTWISE or len(graph.nodes[i].outputs) != 1 for i in order):
            return None
        known = {root}
        for i in order:
            for t in graph.nodes[i].inputs:
                if not t or t in known:
                    continue
                const = graph.scalar(t)
                if const is None or const.eps > _FLOAT32_EPS:
                    return None
            known.add(graph.nodes[i].outputs[0])
        try:
            values, dtypes = self._evaluate(root, order)
        except ValueError:
            return None
        if values is None or output not in values or any(
                d is not None and d.itemsize < 4 for d in (dtypes[root], dtypes.get(output))):
            return None
        return _classify(values, dtypes, root, output)

    def sites(self, covered: set[int]) -> list[RegionSite]:
        """Region sites among the nodes not in `covered` (the templates' sites), graph order."""
        graph = self.graph
        taken = set(covered)
        inner_of_taken: set[str] = set()
        found: list[RegionSite] = []
        roots = dict.fromkeys(
            t for i, node in enumerate(graph.nodes) if node.op in ELEMENTWISE and i not in taken
            for t in node.inputs if t and graph.scalar(t) is None
        )
        for root in roots:
            if root in inner_of_taken:
                continue
            closure = self._closure(root, taken)
            if not any(graph.nodes[i].op in NONLINEAR for i in closure):
                continue
            try:
                values, dtypes = self._evaluate(root, closure)
            except ValueError:  # an op the evaluator cannot compute faithfully
                continue
            if values is None:
                continue
            while (site := self._pick(root, closure, values, dtypes, taken)) is not None:
                found.append(site)
                taken |= site.nodes
                inner_of_taken |= {graph.nodes[j].outputs[0] for j in site.nodes} - {site.output}
        return sorted(found, key=lambda s: min(s.nodes))
