"""Graph-neutral GELU site matching, shared by the ONNX, PyTorch and Keras site finders.

An adapter turns its graph into `OpNode`s that speak a small ONNX-style vocabulary, plus the
scalar constants the graph reads (one-element numpy arrays by tensor name; their dtype is the
precision they were stored in, numpy's or ml_dtypes' such as bfloat16). The vocabulary:

- Mul, Div, Neg, Pow, Add, Sub: elementwise arithmetic (inputs in ONNX order);
- Erf, Tanh, Sigmoid: the cores of the chains below;
- Gelu (attrs["approximate"] = "none" | "tanh") and Relu: one-node activations.

Any other op name is opaque: it only counts as a consumer of its inputs. Chains are matched by
structure, whatever the operand order: erf chains 0.5*x*(1+erf(x/sqrt2)) (also
0.5*x*(1-erf(-x/sqrt2)), the erfc form), tanh chains 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3)))
with Pow or Mul cubes, and sigmoid chains x*sigmoid(1.702*x). The structure gives the claimed
flavour; constants that do not match the catalogue turn the claim into `unknown`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from .catalogue import (
    EXACT,
    INV_SQRT_2,
    PROBES,
    QUICK,
    QUICK_ALPHA,
    RELU,
    SQRT_2_OVER_PI,
    TANH,
    TANH_CUBIC_COEFF,
    UNKNOWN,
    Site,
    is_gelu_shaped,
    residuals,
)

_SCALING_OPS = ("Mul", "Div", "Neg")
_MAX_DEPTH = 8


@dataclass(frozen=True)
class OpNode:
    """One node of a neutral graph: its label in the source graph, op and tensor names."""

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Match:
    """A site found in a neutral graph; nodes are indices into ChainGraph.nodes."""

    op: str
    claimed: str
    nodes: frozenset[int]
    input: str
    output: str
    note: str


@dataclass(frozen=True)
class _Term:
    """coeff * base**power, the nodes that compute it, and the coarsest constant precision."""

    coeff: float
    power: int
    nodes: frozenset[int]
    eps: float

    def times(self, other: _Term, node: int | None = None) -> _Term:
        extra = frozenset() if node is None else frozenset({node})
        return _Term(
            self.coeff * other.coeff, self.power + other.power,
            self.nodes | other.nodes | extra, max(self.eps, other.eps),
        )


_ONE = _Term(1.0, 0, frozenset(), 0.0)


def _precision(dtype: np.dtype) -> float | None:
    """Machine epsilon of a float dtype (numpy's or ml_dtypes' bfloat16, float8), 0 for integers."""
    if dtype.kind in "iu":
        return 0.0
    try:
        return float(ml_dtypes.finfo(dtype).eps)
    except ValueError:  # bool, str, object: not a number
        return None


def close(value: float, expected: float, eps: float) -> bool:
    """Equal up to the precision the constants were stored in (at least 1e-5 relative)."""
    return abs(value - expected) <= max(1e-5, 4.0 * eps) * abs(expected)


def _check(constants: list[tuple[str, float, float]], eps: float) -> tuple[bool, str]:
    """Compare (name, value, expected) constants; return whether all match and a note."""
    off = [f"{name} {value:.7g} (expected {expected:.7g})" for name, value, expected in constants
           if not close(value, expected, eps)]
    return (not off), ("constants match" if not off else "constants off: " + ", ".join(off))


def sigmoid_claim(constants_ok: bool, alpha: float, outer: float) -> str | None:
    """quick when the constants match; unknown when c*x*sigmoid(alpha*x) is still GELU-shaped."""
    if constants_ok:
        return QUICK
    curve = outer * PROBES / (1.0 + np.exp(-alpha * PROBES))
    return UNKNOWN if is_gelu_shaped(residuals(PROBES, curve)) else None


class ChainGraph:
    """Producers, consumers and scalar constants of a neutral graph, and the chain algebra on them.

    outputs are the graph's output tensors: a chain may end at one but not run through it.
    """

    def __init__(self, nodes: Sequence[OpNode], constants: Mapping[str, np.ndarray], outputs: Iterable[str]):
        self.nodes = list(nodes)
        self.producer = {out: i for i, n in enumerate(self.nodes) for out in n.outputs if out}
        self.consumers: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for name in set(n.inputs):
                self.consumers.setdefault(name, []).append(i)
        self.graph_outputs = set(outputs)
        self.constants = constants

    def scalar(self, name: str) -> _Term | None:
        value = self.constants.get(name)
        if value is None:
            return None
        eps = _precision(value.dtype)
        return None if eps is None else _Term(float(value.reshape(-1)[0]), 0, frozenset(), eps)

    def sole_consumer(self, name: str) -> int | None:
        users = self.consumers.get(name, [])
        return users[0] if len(users) == 1 and name not in self.graph_outputs else None

    def monomial(self, name: str, base: str, depth: int = 0) -> _Term | None:
        """Express tensor `name` as coeff * base**power through Mul/Div/Neg/Pow and scalars."""
        if name == base:
            return _Term(1.0, 1, frozenset(), 0.0)
        const = self.scalar(name)
        if const is not None:
            return const
        i = self.producer.get(name)
        if i is None or depth > _MAX_DEPTH:
            return None
        node = self.nodes[i]
        if node.op == "Mul":
            a = self.monomial(node.inputs[0], base, depth + 1)
            b = self.monomial(node.inputs[1], base, depth + 1)
            return a.times(b, i) if a and b else None
        if node.op == "Div":
            a = self.monomial(node.inputs[0], base, depth + 1)
            b = self.monomial(node.inputs[1], base, depth + 1)
            if not (a and b) or b.power != 0 or b.coeff == 0:
                return None
            return a.times(_Term(1.0 / b.coeff, 0, b.nodes, b.eps), i)
        if node.op == "Neg":
            a = self.monomial(node.inputs[0], base, depth + 1)
            return a.times(_Term(-1.0, 0, frozenset(), 0.0), i) if a else None
        if node.op == "Pow":
            a = self.monomial(node.inputs[0], base, depth + 1)
            e = self.scalar(node.inputs[1])
            if not a or not e or e.coeff not in (1.0, 2.0, 3.0, 4.0):
                return None
            k = int(e.coeff)
            return _Term(a.coeff**k, a.power * k, a.nodes | {i}, a.eps)
        return None

    def scaled_bases(self, arg: str) -> list[tuple[str, _Term]]:
        """Tensors that `arg` is a scalar multiple of, nearest first (arg itself included)."""
        out, cur = [(arg, _Term(1.0, 1, frozenset(), 0.0))], arg
        while (i := self.producer.get(cur)) is not None and self.nodes[i].op in _SCALING_OPS:
            node = self.nodes[i]
            if node.op == "Mul" and self.scalar(node.inputs[0]) is not None:
                cur = node.inputs[1]
            elif node.op == "Neg" or self.scalar(node.inputs[1]) is not None:
                cur = node.inputs[0]
            else:
                break
            term = self.monomial(arg, cur)
            if term is None or term.power != 1:
                break
            out.append((cur, term))
        return out

    def product(self, start: str, base: str, stop_at_x: bool) -> tuple[_Term, str] | None:
        """Follow the single-consumer Mul/Div chain from `start` that multiplies in `base` once.

        Stops once base is in and, unless stop_at_x, a constant factor too (the 0.5 of
        0.5*x*(...), which exporters apply before or after x). Returns the factor and the
        chain's output tensor, or None when base never comes in.
        """
        acc, cur = _ONE, start
        while not (acc.power == 1 and (stop_at_x or acc.coeff != 1.0)):
            i = self.sole_consumer(cur)
            if i is None:
                break
            node = self.nodes[i]
            if node.op == "Mul" and list(node.inputs).count(cur) == 1:
                other = node.inputs[1] if node.inputs[0] == cur else node.inputs[0]
                factor = self.monomial(other, base)
            elif node.op == "Div" and node.inputs[0] == cur:
                d = self.monomial(node.inputs[1], base)
                factor = _Term(1.0 / d.coeff, 0, d.nodes, d.eps) if d and d.power == 0 and d.coeff else None
            else:
                break
            if factor is None or acc.power + factor.power > 1:
                break
            acc, cur = acc.times(factor, i), node.outputs[0]
        return (acc, cur) if acc.power == 1 else None

    def one_plus(self, name: str) -> tuple[int, float, int, float] | None:
        """The sole consumer of `name` as c + name or c - name: (node, c, sign, eps)."""
        i = self.sole_consumer(name)
        if i is None:
            return None
        node = self.nodes[i]
        if node.op == "Add":
            other = node.inputs[1] if node.inputs[0] == name else node.inputs[0]
            c, sign = self.scalar(other), 1
        elif node.op == "Sub" and node.inputs[1] == name:
            c, sign = self.scalar(node.inputs[0]), -1
        else:
            return None
        return (i, c.coeff, sign, c.eps) if c else None

    # ---- matchers -------------------------------------------------------------------

    def match_erf(self, i: int) -> Match | None:
        """c*x*(1 +- erf(s*x)): exact when c = 0.5, s = +-1/sqrt2 and the sign agrees."""
        erf = self.nodes[i]
        plus = self.one_plus(erf.outputs[0])
        if plus is None:
            return None
        add, one, sign, one_eps = plus
        for base, scale in self.scaled_bases(erf.inputs[0]):
            found = self.product(self.nodes[add].outputs[0], base, stop_at_x=False)
            if found is None:
                continue
            prod, out = found
            ok, note = _check(
                [("erf scale", sign * scale.coeff, INV_SQRT_2), ("one", one, 1.0), ("outer", prod.coeff, 0.5)],
                max(scale.eps, one_eps, prod.eps),
            )
            nodes = scale.nodes | prod.nodes | {i, add}
            return Match("erf-chain", EXACT if ok else UNKNOWN, nodes, base, out, note)
        return None

    def match_tanh(self, i: int) -> Match | None:
        """c*x*(1+tanh(s*(a*x + b*x^3))): tanh flavour when c=0.5, s*a=sqrt(2/pi), b/a=0.044715."""
        th = self.nodes[i]
        plus = self.one_plus(th.outputs[0])
        if plus is None or plus[2] != 1:
            return None
        add, one, _, one_eps = plus
        for inner, scale in self.scaled_bases(th.inputs[0]):
            j = self.producer.get(inner)
            if j is None or self.nodes[j].op != "Add":
                continue
            p, q = self.nodes[j].inputs
            for lin, cube in ((p, q), (q, p)):
                for base, linear in self.scaled_bases(lin):
                    cubic = self.monomial(cube, base)
                    if cubic is None or cubic.power != 3:
                        continue
                    found = self.product(self.nodes[add].outputs[0], base, stop_at_x=False)
                    if found is None:
                        continue
                    prod, out = found
                    ok, note = _check(
                        [("tanh scale", scale.coeff * linear.coeff, SQRT_2_OVER_PI),
                         ("cubic coeff", cubic.coeff / linear.coeff, TANH_CUBIC_COEFF),
                         ("one", one, 1.0), ("outer", prod.coeff, 0.5)],
                        max(scale.eps, linear.eps, cubic.eps, one_eps, prod.eps),
                    )
                    nodes = scale.nodes | linear.nodes | cubic.nodes | prod.nodes | {i, j, add}
                    return Match("tanh-chain", TANH if ok else UNKNOWN, nodes, base, out, note)
        return None

    def match_sigmoid(self, i: int) -> Match | None:
        """c*x*sigmoid(a*x): quick when a = 1.702 and c = 1; SiLU-like curves are no site."""
        sig = self.nodes[i]
        for base, scale in self.scaled_bases(sig.inputs[0]):
            found = self.product(sig.outputs[0], base, stop_at_x=True)
            if found is None:
                continue
            prod, out = found
            ok, note = _check(
                [("sigmoid scale", scale.coeff, QUICK_ALPHA), ("outer", prod.coeff, 1.0)],
                max(scale.eps, prod.eps),
            )
            claimed = sigmoid_claim(ok, scale.coeff, prod.coeff)
            if claimed is None:
                return None
            return Match("sigmoid-chain", claimed, scale.nodes | prod.nodes | {i}, base, out, note)
        return None

    def match_gelu(self, i: int) -> Match | None:
        """A one-node Gelu: its approximate attribute says the flavour."""
        node = self.nodes[i]
        approximate = node.attrs.get("approximate", "none")
        claimed = {"none": EXACT, "tanh": TANH}.get(approximate, UNKNOWN)
        return Match("Gelu", claimed, frozenset({i}), node.inputs[0], node.outputs[0], f"approximate='{approximate}'")


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
    source node expanded into several neutral nodes (TF's Erfc) is listed once.
    """
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
    matches.sort(key=lambda m: min(m.nodes))
    sites = []
    for k, m in enumerate(matches):
        labels = tuple(dict.fromkeys(graph.nodes[j].name for j in sorted(m.nodes)))
        sites.append(Site(f"{k}:{labels[0]}", m.op, m.claimed, labels, m.input, m.output, m.note))
    return sites


def find_relu_sites(graph: ChainGraph, op: str) -> list[Site]:
    """Relu nodes as sites (claimed relu, shown as `op`), ids "relu:{index}:{node}"."""
    relus = [n for n in graph.nodes if n.op == "Relu"]
    return [
        Site(f"relu:{k}:{n.name}", op, RELU, (n.name,), n.inputs[0], n.outputs[0])
        for k, n in enumerate(relus)
    ]


def find_activation_sites(graph: ChainGraph, relu_op: str, fused: Matcher | None = None) -> list[Site]:
    """GELU sites and ReLU sites together, in graph order (what the GELU verdict aligns)."""
    order = {node.name: i for i, node in reversed(list(enumerate(graph.nodes)))}
    sites = find_sites(graph, fused) + find_relu_sites(graph, relu_op)
    return sorted(sites, key=lambda s: min(order[label] for label in s.nodes))
