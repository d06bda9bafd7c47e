"""The graph-neutral core of GELU site matching: the neutral graph and its chain templates.

An adapter turns its graph into `OpNode`s that speak a small ONNX-style vocabulary, plus the
scalar constants the graph reads (one-element numpy arrays by tensor name; their dtype is the
precision they were stored in, numpy's or ml_dtypes' such as bfloat16). The vocabulary:

- Mul, Div, Neg, Pow, Add, Sub: elementwise arithmetic (inputs in ONNX order);
- Erf, Tanh, Sigmoid: the cores of the chains below;
- Gelu (attrs["approximate"] = "none" | "tanh"), Silu and Relu: one-node activations;
- Exp, Abs, Sign, Sqrt, Log, Reciprocal, Softplus, Sum, Min, Max, Clip (attrs min/max or scalar
  inputs), Cast (attrs["to"]: a numpy dtype), Identity: the rest of what `regions` evaluates.

Any other op name is opaque: it only counts as a consumer of its inputs. Chains are matched by
structure, whatever the operand order: erf chains 0.5*x*(1+erf(x/sqrt2)) (also
0.5*x*(1-erf(-x/sqrt2)), the erfc form), tanh chains 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3)))
with Pow or Mul cubes, and sigmoid chains x*sigmoid(1.702*x). These templates (the `match_*`
methods of `ChainGraph`) name what they find, claiming the flavour by structure, constants that
do not match the catalogue making the claim `unknown`. The entry points that run them, measure
their matches and find what they miss are in `chains`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from .catalogue import (
    EXACT,
    INV_SQRT_2,
    QUICK,
    QUICK_ALPHA,
    SQRT_2_OVER_PI,
    TANH,
    TANH_CUBIC_COEFF,
    UNKNOWN,
    flavour,
    gelu20_flavour,
)
from .classification import PROBES, is_gelu_shaped, residuals

_EXACT, _TANH = flavour(EXACT).constants, flavour(TANH).constants
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
    scale: float = 1.0


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


# Ops (of any adapter's vocabulary) linear in their data input: a constant scale of a site whose
# whole output they take is absorbed by them (a converter may fold GELU's 0.5 into their weights).
LINEAR_OPS = frozenset([
    "MatMul", "Gemm", "Conv", "ConvTranspose",  # ONNX
    "FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "BATCH_MATMUL", "TRANSPOSE_CONV",  # TFLite
    "aten.linear.default", "aten.mm.default", "aten.matmul.default", "aten.bmm.default",
    "aten.conv1d.default", "aten.conv2d.default",  # torch.export
    "BatchMatMulV2", "Conv2D", "Einsum",  # TensorFlow (MatMul is ONNX's name too)
])


class ChainGraph:
    """Producers, consumers and scalar constants of a neutral graph, and the chain algebra on them.

    outputs are the graph's output tensors: a chain may end at one but not run through it.
    dtypes, where an adapter knows them, are the numpy dtypes of tensors (regions round to them).
    """

    def __init__(self, nodes: Sequence[OpNode], constants: Mapping[str, np.ndarray], outputs: Iterable[str],
                 dtypes: Mapping[str, np.dtype] | None = None):
        self.nodes = list(nodes)
        self.producer = {out: i for i, n in enumerate(self.nodes) for out in n.outputs if out}
        self.consumers: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for name in set(n.inputs):
                self.consumers.setdefault(name, []).append(i)
        self.graph_outputs = set(outputs)
        self.constants = constants
        self.dtypes = dict(dtypes or {})

    def live_tensors(self) -> set[str]:
        """Tensors some graph output depends on."""
        live, stack = set(), list(self.graph_outputs)
        while stack:
            t = stack.pop()
            if t in live:
                continue
            live.add(t)
            i = self.producer.get(t)
            if i is not None:
                stack.extend(name for name in self.nodes[i].inputs if name)
        return live

    def cone(self, output: str, within: set[int]) -> set[int]:
        """The nodes of `within` that `output` depends on (its producer included)."""
        cone, stack = set(), [self.producer[output]]
        while stack:
            i = stack.pop()
            if i in cone:
                continue
            cone.add(i)
            stack.extend(j for t in self.nodes[i].inputs if (j := self.producer.get(t)) is not None and j in within)
        return cone

    def leaks(self, nodes: set[int], output: str) -> bool:
        """Whether any tensor the nodes compute, other than `output`, is read outside them or is a
        graph output."""
        for i in nodes:
            t = self.nodes[i].outputs[0]
            if t != output and (t in self.graph_outputs or any(c not in nodes for c in self.consumers.get(t, []))):
                return True
        return False

    def absorbing_consumers(self, tensor: str) -> str:
        """The linear ops taking all of `tensor` (joined names), or "" when any other op reads it."""
        users = self.consumers.get(tensor, [])
        if not users or tensor in self.graph_outputs or any(self.nodes[i].op not in LINEAR_OPS for i in users):
            return ""
        return ", ".join(dict.fromkeys(self.nodes[i].op for i in users))

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
                [("erf scale", sign * scale.coeff, INV_SQRT_2), ("one", one, _EXACT["one"]),
                 ("outer", prod.coeff, _EXACT["half"])],
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
            for base, linear, cubic in self._cubic_terms(inner):
                found = self.product(self.nodes[add].outputs[0], base, stop_at_x=False)
                if found is None:
                    continue
                prod, out = found
                ok, note = _check(
                    [("tanh scale", scale.coeff * linear.coeff, SQRT_2_OVER_PI),
                     ("cubic coeff", cubic.coeff / linear.coeff, TANH_CUBIC_COEFF),
                     ("one", one, _TANH["one"]), ("outer", prod.coeff, _TANH["half"])],
                    max(scale.eps, linear.eps, cubic.eps, one_eps, prod.eps),
                )
                nodes = scale.nodes | linear.nodes | cubic.nodes | prod.nodes | {i, add}
                return Match("tanh-chain", TANH if ok else UNKNOWN, nodes, base, out, note)
        return None

    def _cubic_terms(self, name: str):
        """`name` as a*x + b*x^3: yields (base, a*x term, b*x^3 term), the terms carrying the nodes
        that compute them. Written as a sum, or factored as HF gelu_fast writes it,
        (s*x) * (c + d*x^2) (x * 0.7978845608 * (1 + 0.044715 * x * x)), read as s*c*x + s*d*x^3."""
        k = self.producer.get(name)
        if k is None:
            return
        node = self.nodes[k]
        if node.op == "Add":
            p, q = node.inputs[:2]
            for lin, cube in ((p, q), (q, p)):
                for base, linear in self.scaled_bases(lin):
                    cubic = self.monomial(cube, base)
                    if cubic is not None and cubic.power == 3:
                        yield base, _Term(linear.coeff, 1, linear.nodes | {k}, linear.eps), cubic
        elif node.op == "Mul":
            p, q = node.inputs[:2]
            for lin, poly in ((p, q), (q, p)):
                a = self.producer.get(poly)
                if a is None or self.nodes[a].op != "Add":
                    continue
                u, v = self.nodes[a].inputs[:2]
                for const_name, quad_name in ((u, v), (v, u)):
                    const = self.scalar(const_name)
                    if const is None:
                        continue
                    for base, linear in self.scaled_bases(lin):
                        quad = self.monomial(quad_name, base)
                        if quad is None or quad.power != 2:
                            continue
                        yield (base,
                               _Term(linear.coeff * const.coeff, 1, linear.nodes | {k, a}, max(linear.eps, const.eps)),
                               _Term(linear.coeff * quad.coeff, 3, quad.nodes, max(linear.eps, quad.eps)))

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
        """A one-node Gelu: its approximate attribute says the flavour (the catalogue's Gelu-20 values)."""
        node = self.nodes[i]
        approximate = node.attrs.get("approximate", "none")
        claimed = gelu20_flavour(approximate) or UNKNOWN
        return Match("Gelu", claimed, frozenset({i}), node.inputs[0], node.outputs[0], f"approximate='{approximate}'")
