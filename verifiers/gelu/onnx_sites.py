"""Find GELU sites in an ONNX graph: fused GELU ops and the primitive chains exporters emit.

Chains are matched by structure, whatever the operand order: erf chains
0.5*x*(1+erf(x/sqrt2)) (also 0.5*x*(1-erf(-x/sqrt2)), tf2onnx's erfc form), tanh chains
0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))) with Pow or Mul cubes, and sigmoid chains
x*sigmoid(1.702*x). The structure gives the claimed flavour; constants that do not match
the catalogue turn the claim into `unknown`. Only the top-level graph is searched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

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

MS_DOMAIN = "com.microsoft"
_SCALING_OPS = ("Mul", "Div", "Neg")
_MAX_DEPTH = 8


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


@dataclass(frozen=True)
class _Match:
    op: str
    claimed: str
    nodes: frozenset[int]
    input: str
    output: str
    note: str


def _close(value: float, expected: float, eps: float) -> bool:
    """Equal up to the precision the constants were stored in (at least 1e-5 relative)."""
    return abs(value - expected) <= max(1e-5, 4.0 * eps) * abs(expected)


def _check(constants: list[tuple[str, float, float]], eps: float) -> tuple[bool, str]:
    """Compare (name, value, expected) constants; return whether all match and a note."""
    off = [f"{name} {value:.7g} (expected {expected:.7g})" for name, value, expected in constants
           if not _close(value, expected, eps)]
    return (not off), ("constants match" if not off else "constants off: " + ", ".join(off))


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


class _GraphIndex:
    """Producers, consumers and scalar constants of one graph, and the chain algebra on them."""

    def __init__(self, graph: onnx.GraphProto):
        self.nodes = list(graph.node)
        self.producer = {out: i for i, n in enumerate(self.nodes) for out in n.output if out}
        self.consumers: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for name in set(n.input):
                self.consumers.setdefault(name, []).append(i)
        self.graph_outputs = {o.name for o in graph.output}
        self.constants = scalar_constants(graph)

    def scalar(self, name: str) -> _Term | None:
        value = self.constants.get(name)
        if value is None or value.dtype.kind not in "fiu":
            return None
        eps = float(np.finfo(value.dtype).eps) if value.dtype.kind == "f" else 0.0
        return _Term(float(value.reshape(-1)[0]), 0, frozenset(), eps)

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
        if node.op_type == "Mul":
            a = self.monomial(node.input[0], base, depth + 1)
            b = self.monomial(node.input[1], base, depth + 1)
            return a.times(b, i) if a and b else None
        if node.op_type == "Div":
            a = self.monomial(node.input[0], base, depth + 1)
            b = self.monomial(node.input[1], base, depth + 1)
            if not (a and b) or b.power != 0 or b.coeff == 0:
                return None
            return a.times(_Term(1.0 / b.coeff, 0, b.nodes, b.eps), i)
        if node.op_type == "Neg":
            a = self.monomial(node.input[0], base, depth + 1)
            return a.times(_Term(-1.0, 0, frozenset(), 0.0), i) if a else None
        if node.op_type == "Pow":
            a = self.monomial(node.input[0], base, depth + 1)
            e = self.scalar(node.input[1])
            if not a or not e or e.coeff not in (1.0, 2.0, 3.0, 4.0):
                return None
            k = int(e.coeff)
            return _Term(a.coeff**k, a.power * k, a.nodes | {i}, a.eps)
        return None

    def scaled_bases(self, arg: str) -> list[tuple[str, _Term]]:
        """Tensors that `arg` is a scalar multiple of, nearest first (arg itself included)."""
        out, cur = [(arg, _Term(1.0, 1, frozenset(), 0.0))], arg
        while (i := self.producer.get(cur)) is not None and self.nodes[i].op_type in _SCALING_OPS:
            node = self.nodes[i]
            if node.op_type == "Mul" and self.scalar(node.input[0]) is not None:
                cur = node.input[1]
            elif node.op_type == "Neg" or self.scalar(node.input[1]) is not None:
                cur = node.input[0]
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
            if node.op_type == "Mul" and list(node.input).count(cur) == 1:
                other = node.input[1] if node.input[0] == cur else node.input[0]
                factor = self.monomial(other, base)
            elif node.op_type == "Div" and node.input[0] == cur:
                d = self.monomial(node.input[1], base)
                factor = _Term(1.0 / d.coeff, 0, d.nodes, d.eps) if d and d.power == 0 and d.coeff else None
            else:
                break
            if factor is None or acc.power + factor.power > 1:
                break
            acc, cur = acc.times(factor, i), node.output[0]
        return (acc, cur) if acc.power == 1 else None

    def one_plus(self, name: str) -> tuple[int, float, int, float] | None:
        """The sole consumer of `name` as c + name or c - name: (node, c, sign, eps)."""
        i = self.sole_consumer(name)
        if i is None:
            return None
        node = self.nodes[i]
        if node.op_type == "Add":
            other = node.input[1] if node.input[0] == name else node.input[0]
            c, sign = self.scalar(other), 1
        elif node.op_type == "Sub" and node.input[1] == name:
            c, sign = self.scalar(node.input[0]), -1
        else:
            return None
        return (i, c.coeff, sign, c.eps) if c else None

    # ---- matchers -------------------------------------------------------------------

    def match_erf(self, i: int) -> _Match | None:
        """c*x*(1 +- erf(s*x)): exact when c = 0.5, s = +-1/sqrt2 and the sign agrees."""
        erf = self.nodes[i]
        plus = self.one_plus(erf.output[0])
        if plus is None:
            return None
        add, one, sign, one_eps = plus
        for base, scale in self.scaled_bases(erf.input[0]):
            found = self.product(self.nodes[add].output[0], base, stop_at_x=False)
            if found is None:
                continue
            prod, out = found
            ok, note = _check(
                [("erf scale", sign * scale.coeff, INV_SQRT_2), ("one", one, 1.0), ("outer", prod.coeff, 0.5)],
                max(scale.eps, one_eps, prod.eps),
            )
            nodes = scale.nodes | prod.nodes | {i, add}
            return _Match("erf-chain", EXACT if ok else UNKNOWN, nodes, base, out, note)
        return None

    def match_tanh(self, i: int) -> _Match | None:
        """c*x*(1+tanh(s*(a*x + b*x^3))): tanh flavour when c=0.5, s*a=sqrt(2/pi), b/a=0.044715."""
        th = self.nodes[i]
        plus = self.one_plus(th.output[0])
        if plus is None or plus[2] != 1:
            return None
        add, one, _, one_eps = plus
        for inner, scale in self.scaled_bases(th.input[0]):
            j = self.producer.get(inner)
            if j is None or self.nodes[j].op_type != "Add":
                continue
            p, q = self.nodes[j].input
            for lin, cube in ((p, q), (q, p)):
                for base, linear in self.scaled_bases(lin):
                    cubic = self.monomial(cube, base)
                    if cubic is None or cubic.power != 3:
                        continue
                    found = self.product(self.nodes[add].output[0], base, stop_at_x=False)
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
                    return _Match("tanh-chain", TANH if ok else UNKNOWN, nodes, base, out, note)
        return None

    def match_sigmoid(self, i: int) -> _Match | None:
        """c*x*sigmoid(a*x): quick when a = 1.702 and c = 1; SiLU-like curves are no site."""
        sig = self.nodes[i]
        for base, scale in self.scaled_bases(sig.input[0]):
            found = self.product(sig.output[0], base, stop_at_x=True)
            if found is None:
                continue
            prod, out = found
            ok, note = _check(
                [("sigmoid scale", scale.coeff, QUICK_ALPHA), ("outer", prod.coeff, 1.0)],
                max(scale.eps, prod.eps),
            )
            claimed = _sigmoid_claim(ok, scale.coeff, prod.coeff)
            if claimed is None:
                return None
            return _Match("sigmoid-chain", claimed, scale.nodes | prod.nodes | {i}, base, out, note)
        return None

    def match_fused(self, i: int) -> _Match | None:
        """One-node GELUs: Gelu-20, and com.microsoft Gelu, FastGelu, BiasGelu, QuickGelu."""
        node = self.nodes[i]
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if domain == "" and node.op_type == "Gelu":
            approximate = attrs.get("approximate", b"none").decode()
            claimed = {"none": EXACT, "tanh": TANH}.get(approximate, UNKNOWN)
            return _Match("Gelu", claimed, frozenset({i}), node.input[0], node.output[0],
                          f"approximate='{approximate}'")
        if domain != MS_DOMAIN:
            return None
        if node.op_type == "QuickGelu":
            alpha = float(attrs.get("alpha", QUICK_ALPHA))
            claimed = _sigmoid_claim(_close(alpha, QUICK_ALPHA, np.finfo(np.float32).eps), alpha, 1.0)
            note = f"alpha={alpha:.7g}"
        else:
            claimed, note = {
                "Gelu": (EXACT, "exact kernel"),
                "FastGelu": (TANH, "tanh kernel"),
                "BiasGelu": (EXACT, "exact kernel (onnxruntime's optimizer writes it for tanh Gelu too)"),
            }.get(node.op_type, (None, ""))
        if claimed is None:
            return None
        return _Match(f"{MS_DOMAIN}.{node.op_type}", claimed, frozenset({i}), node.input[0], node.output[0], note)


def _sigmoid_claim(constants_ok: bool, alpha: float, outer: float) -> str | None:
    """quick when the constants match; unknown when c*x*sigmoid(alpha*x) is still GELU-shaped."""
    if constants_ok:
        return QUICK
    curve = outer * PROBES / (1.0 + np.exp(-alpha * PROBES))
    return UNKNOWN if is_gelu_shaped(residuals(PROBES, curve)) else None


_CHAIN_MATCHERS = {
    "Erf": _GraphIndex.match_erf,
    "Tanh": _GraphIndex.match_tanh,
    "Sigmoid": _GraphIndex.match_sigmoid,
}


def find_gelu_sites(model: onnx.ModelProto) -> list[Site]:
    """Every GELU site in the model's top-level graph, in graph order.

    Relu nodes are not GELU sites; list them with `find_relu_sites`.
    """
    index = _GraphIndex(model.graph)
    matches: list[_Match] = []
    covered: set[int] = set()
    for i, node in enumerate(index.nodes):
        if i in covered:
            continue
        match = _CHAIN_MATCHERS.get(node.op_type, _GraphIndex.match_fused)(index, i)
        if match is not None and not (match.nodes & covered):
            matches.append(match)
            covered |= match.nodes
    matches.sort(key=lambda m: min(m.nodes))
    sites = []
    for k, m in enumerate(matches):
        labels = tuple(node_label(index.nodes[j]) for j in sorted(m.nodes))
        sites.append(Site(f"{k}:{labels[0]}", m.op, m.claimed, labels, m.input, m.output, m.note))
    return sites


def find_relu_sites(model: onnx.ModelProto) -> list[Site]:
    """Relu nodes as sites (claimed relu), ids "relu:{index}:{node}", for the verdict step."""
    relus = [n for n in model.graph.node if n.op_type == "Relu" and n.domain in ("", "ai.onnx")]
    return [
        Site(f"relu:{k}:{node_label(n)}", "Relu", RELU, (node_label(n),), n.input[0], n.output[0])
        for k, n in enumerate(relus)
    ]
