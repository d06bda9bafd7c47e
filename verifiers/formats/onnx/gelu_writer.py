"""Write a GELU flavour into an ONNX graph: the forms each catalogued flavour is written in, and
`replace_site`, which swaps one site for a fresh implementation of a flavour.

What each flavour is written as is a `Form` in `FORMS`, keyed (flavour, form); which forms a
flavour has is its catalogue record's `forms` (a Gelu-20 form for every flavour Gelu-20 expresses,
with the record's `gelu20_approximate`):

  exact/primitives  Div(x, sqrt2) -> Erf -> Add(., 1) -> Mul(x, .) -> Mul(., 0.5)
                    (the TorchScript exporter's order)
  exact/erf_free    Div(x, sqrt2) = z; erf(z) = q(Relu(-z)) - q(Relu(z)) with Abramowitz &
                    Stegun 7.1.26's q(u) = (a1 t + ... + a5 t^5) Exp(-u*u), t = 1/(1 + p u);
                    Add(., 1) -> Mul(x, .) -> Mul(., 0.5): no Erf, no Sign, no Where, for
                    runtimes without Erf (old TFLite); within 1.5e-7 of erf (see _exact_erf_free)
  exact/gelu_op     Gelu(x, approximate='none')                       opset >= 20
  tanh/primitives   x3 = Mul(Mul(x, x), x); Mul(x3, 0.044715) -> Add(x, .) ->
                    Mul(., sqrt(2/pi)) -> Tanh -> Add(., 1) -> Mul(x, .) -> Mul(., 0.5)
                    (a x*x*x cube, no Pow: converters that fuse the tanh formula written
                    with Pow, e.g. TFLite's, leave it alone)
  tanh/gelu_op      Gelu(x, approximate='tanh')                       opset >= 20
  quick/primitives  Mul(x, Sigmoid(Mul(x, 1.702)))
  relu/primitives   Relu(x)
  identity/primitives  Identity(x): the activation is gone

A form's write function takes a writer with two methods, `const(key)` (a scalar holding
CONSTANTS[key]) and `node(op_type, inputs, output=None, **attrs)` (one node, returning its
output): `_Writer` here writes ONNX; exporter.rewrites.tflite_gelu writes the same forms as
TFLite operators. Constants are the catalogue records' constants plus the A&S coefficients of the
erf-free form; `constants=` overrides them by key (see `CONSTANTS`), which is how a fixture writes
the tanh chain with the 0.0447 typo. In ONNX they are scalar initializers in the element type of
site.input (declared, else inferred, else float32).

New nodes and tensors are named "{site's first node}/{flavour}/{op}" (made unique against
every existing name), so rewriting the same model twice gives the same graph. Every rewrite works
on the top-level graph only, returns a new model (the input is never mutated) and keeps the model
valid (`onnx.checker.check_model(full_check=True)`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import onnx
from onnx import helper

from verifiers.onnx_model import DEFAULT_DOMAINS, default_opset, elem_types

from verifiers.gelu.catalogue import (
    ERF_FREE,
    EXACT,
    FLAVOURS,
    GELU_OP,
    IDENTITY,
    PRIMITIVES,
    QUICK,
    RELU,
    TANH,
    Flavour,
    Site,
)
from verifiers.onnx_model import node_label, subgraph_reads

GELU_OP_MIN_OPSET = 20
# exact/erf_free: Abramowitz & Stegun 7.1.26, erf(z) ~ 1 - (a1 t + ... + a5 t^5) exp(-z^2),
# t = 1/(1 + p z), z >= 0, max error 1.5e-7.
ERF_FREE_CONSTANTS = {
    "as_p": 0.3275911,
    "as_a1": 0.254829592,
    "as_a2": -0.284496736,
    "as_a3": 1.421413741,
    "as_a4": -1.453152027,
    "as_a5": 1.061405429,
}


def _constants() -> dict[str, float]:
    """Every record's constants (one value per key) and the erf-free form's."""
    out: dict[str, float] = {}
    for f in FLAVOURS.values():
        for key, value in f.constants.items():
            if out.setdefault(key, value) != value:
                raise ValueError(f"constant {key!r}: flavour {f.name} has {value}, another flavour {out[key]}")
    return {**out, **ERF_FREE_CONSTANTS}


# The constants the forms use, by the key `constants=` overrides them with: the 0.5 and 1 of
# 0.5*x*(1+...), sqrt2 (exact: erf(x / sqrt2)), tanh_scale (sqrt(2/pi)), cubic (0.044715; the
# "0.0447 typo" overrides it), quick_alpha (1.702), as_p and as_a1..as_a5 (erf_free).
CONSTANTS: dict[str, float] = _constants()


class _Writer:
    """Emits nodes and scalar initializers for one rewrite under a fixed, collision-free prefix."""

    def __init__(self, prefix: str, elem_type: int, constants: Mapping[str, float], taken: set[str]):
        self.prefix, self.elem_type, self.constants, self.taken = prefix, elem_type, constants, taken
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def _fresh(self, stem: str) -> str:
        name, k = f"{self.prefix}/{stem}", 0
        while name in self.taken:
            k += 1
            name = f"{self.prefix}/{stem}_{k}"
        self.taken.add(name)
        return name

    def const(self, key: str) -> str:
        """A scalar initializer holding constants[key] in the site's element type."""
        name = self._fresh(key)
        self.initializers.append(helper.make_tensor(name, self.elem_type, [], [self.constants[key]]))
        return name

    def node(self, op_type: str, inputs: Iterable[str], output: str | None = None, **attrs) -> str:
        """Append one default-domain node; returns its output (fresh unless given)."""
        name = self._fresh(op_type)
        output = output or self._fresh(f"{op_type}_output_0")
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=name, **attrs))
        return output


# ---- forms: how each flavour is written, x -> y ------------------------------------------


def _exact_primitives(w: _Writer, x: str, y: str) -> None:
    """0.5*x*(1+erf(x/sqrt2)) as Div / Erf / Add / Mul / Mul."""
    erf = w.node("Erf", [w.node("Div", [x, w.const("sqrt2")])])
    w.node("Mul", [w.node("Mul", [x, w.node("Add", [erf, w.const("one")])]), w.const("half")], y)


def _as_tail(w: _Writer, u: str) -> str:
    """q(u) = (a1 t + a2 t^2 + ... + a5 t^5) exp(-u^2), t = 1/(1 + p u): A&S 7.1.26's 1 - erf(u), u >= 0."""
    t = w.node("Div", [w.const("one"), w.node("Add", [w.node("Mul", [u, w.const("as_p")]), w.const("one")])])
    poly = w.node("Mul", [t, w.const("as_a5")])
    for key in ("as_a4", "as_a3", "as_a2", "as_a1"):
        poly = w.node("Mul", [w.node("Add", [poly, w.const(key)]), t])
    return w.node("Mul", [poly, w.node("Exp", [w.node("Neg", [w.node("Mul", [u, u])])])])


def _exact_erf_free(w: _Writer, x: str, y: str) -> None:
    """0.5*x*(1+erf(x/sqrt2)) with erf(z) = q(relu(-z)) - q(relu(z)) (A&S 7.1.26, no Erf, no Sign).

    For z >= 0 this is q(0) - q(z) = erf_AS(z) - 1e-9 (q(0) = a1+...+a5 = 0.999999999), for z < 0
    -(erf_AS(-z) - 1e-9): odd, as erf is. Ops: Div, Relu, Neg, Mul, Add, Exp, Sub (opset 13+,
    every TFLite runtime). Measured on 200001 points of x in [-10, 10] (erf at z = x/sqrt2)
    against math.erf, onnxruntime 1.32 CPU:
      erf:   max error 1.4e-7 in float64, 5.3e-7 in float32 (float32 rounding of q(0) - q(z));
      GELU:  max error 2.1e-7 in float64, 4.6e-7 in float32. The erf chain with onnxruntime's
             Erf is 4.5e-7 off in float32 (cancellation in 1+erf); the TFLite lowering of this
             form (exporter.rewrites.tflite_gelu) is 4.6e-7 off with the builtin kernels and
             with XNNPACK alike. All well inside FLOAT32_TOLERANCE (3e-6): it measures exact.
    """
    z = w.node("Div", [x, w.const("sqrt2")])
    positive = w.node("Relu", [z])
    negative = w.node("Relu", [w.node("Neg", [z])])
    erf = w.node("Sub", [_as_tail(w, negative), _as_tail(w, positive)])
    w.node("Mul", [w.node("Mul", [x, w.node("Add", [erf, w.const("one")])]), w.const("half")], y)


def _tanh_primitives(w: _Writer, x: str, y: str) -> None:
    """0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x*x*x))) with a Mul cube (no Pow)."""
    cube = w.node("Mul", [w.node("Mul", [x, x]), x])
    inner = w.node("Add", [x, w.node("Mul", [cube, w.const("cubic")])])
    th = w.node("Tanh", [w.node("Mul", [inner, w.const("tanh_scale")])])
    w.node("Mul", [w.node("Mul", [x, w.node("Add", [th, w.const("one")])]), w.const("half")], y)


def _quick_primitives(w: _Writer, x: str, y: str) -> None:
    """x*sigmoid(1.702x) as Mul / Sigmoid / Mul."""
    w.node("Mul", [x, w.node("Sigmoid", [w.node("Mul", [x, w.const("quick_alpha")])])], y)


def _gelu_op(approximate: str) -> Callable[[_Writer, str, str], None]:
    def write(w: _Writer, x: str, y: str) -> None:
        w.node("Gelu", [x], y, approximate=approximate)

    write.__doc__ = f"One Gelu-20 node, approximate='{approximate}'."
    return write


def _relu(w: _Writer, x: str, y: str) -> None:
    """Relu(x)."""
    w.node("Relu", [x], y)


def _identity(w: _Writer, x: str, y: str) -> None:
    """Identity(x): the output is the input."""
    w.node("Identity", [x], y)


@dataclass(frozen=True)
class Form:
    """One way to write a flavour: what it writes and the lowest default opset it needs."""

    flavour: str
    form: str
    writes: str
    write: Callable[[_Writer, str, str], None]
    min_opset: int = 13


# (flavour, form) -> what the form writes and the function that writes it; Gelu-20 forms come from
# the records' gelu20_approximate.
_WRITERS: dict[tuple[str, str], tuple[str, Callable[[_Writer, str, str], None]]] = {
    (EXACT, PRIMITIVES): ("Div(x, sqrt2) / Erf / Add 1 / Mul x / Mul 0.5", _exact_primitives),
    (EXACT, ERF_FREE): ("Div(x, sqrt2) / erf(z) = q(Relu(-z)) - q(Relu(z)), q(u) = A&S 7.1.26 "
                        "polynomial(1/(1+p u)) * Exp(-u*u) / Add 1 / Mul x / Mul 0.5 (no Erf, no Sign)",
                        _exact_erf_free),
    (TANH, PRIMITIVES): ("x*x*x / Mul 0.044715 / Add x / Mul sqrt(2/pi) / Tanh / Add 1 / Mul x / Mul 0.5",
                         _tanh_primitives),
    (QUICK, PRIMITIVES): ("Mul 1.702 / Sigmoid / Mul x", _quick_primitives),
    (RELU, PRIMITIVES): ("Relu", _relu),
    (IDENTITY, PRIMITIVES): ("Identity (the activation removed)", _identity),
}


def _form(f: Flavour, form: str) -> Form:
    if form == GELU_OP:
        return Form(f.name, form, f"Gelu(approximate='{f.gelu20_approximate}')", _gelu_op(f.gelu20_approximate),
                    GELU_OP_MIN_OPSET)
    if (f.name, form) not in _WRITERS:
        raise ValueError(f"flavour {f.name} lists form {form!r}, which has no writer here")
    writes, write = _WRITERS[f.name, form]
    return Form(f.name, form, writes, write)


FORMS: dict[tuple[str, str], Form] = {(f.name, form): _form(f, form) for f in FLAVOURS.values() for form in f.forms}
if _WRITERS.keys() - FORMS.keys():
    raise ValueError(f"writers for forms no flavour lists: {sorted(_WRITERS.keys() - FORMS.keys())}")


# ---- where a rewrite applies -------------------------------------------------------------------


def _all_names(graph: onnx.GraphProto) -> set[str]:
    """Node names and tensor names in use at the top level (for fresh-name generation)."""
    names = {n.name for n in graph.node} | {t for n in graph.node for t in (*n.input, *n.output)}
    names |= {t.name for t in graph.initializer} | {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
    return names - {""}


@dataclass(frozen=True)
class Placement:
    """Where one rewrite applies: node indices to remove, the tensor read, the tensor written."""

    nodes: tuple[int, ...]
    input: str
    output: str
    bias: str | None
    prefix: str


def locate(graph: onnx.GraphProto, site: Site) -> Placement:
    """The graph indices of a site's nodes, checked to compute site.output from site.input alone."""
    index: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        index.setdefault(node_label(node), i)
    missing = [label for label in site.nodes if label not in index]
    if missing:
        raise ValueError(f"site {site.site_id}: nodes {missing} are not in this model's top-level graph")
    nodes = tuple(sorted({index[label] for label in site.nodes}))
    produced = {out for i in nodes for out in graph.node[i].output if out}
    if site.output not in produced:
        raise ValueError(f"site {site.site_id}: its nodes do not write {site.output!r}")
    kept_readers = {t for i, n in enumerate(graph.node) if i not in nodes for t in n.input}
    kept_readers |= subgraph_reads(graph) | {o.name for o in graph.output}
    leaking = sorted((produced - {site.output}) & kept_readers)
    if leaking:
        raise ValueError(f"site {site.site_id}: intermediate tensors {leaking} are read outside the site")
    bias = None
    if len(nodes) == 1:  # FastGelu / BiasGelu carry a bias input: keep adding it
        node = graph.node[nodes[0]]
        extra = [name for name in node.input[1:] if name]
        if node.domain not in DEFAULT_DOMAINS and node.input[0] == site.input and extra:
            bias = extra[0]
    return Placement(nodes, site.input, site.output, bias, site.nodes[0])


def write_forms(model: onnx.ModelProto, placements: list[tuple[Placement, Form]],
                constants: Mapping[str, float], elem_type: int | None) -> onnx.ModelProto:
    """Copy the model, write each placement's form in its place, then drop what only they read."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    taken = _all_names(graph)
    types = elem_types(model, {t.input for t, _ in placements}) if elem_type is None else {}
    removed = {i for t, _ in placements for i in t.nodes}
    removed_reads = {name for i in removed for name in graph.node[i].input}
    removed_outputs = {name for i in removed for name in graph.node[i].output}
    written: dict[int, list[onnx.NodeProto]] = {}
    for target, form in placements:
        etype = elem_type or types.get(target.input, onnx.TensorProto.FLOAT)
        writer = _Writer(f"{target.prefix}/{form.flavour}", etype, constants, taken)
        x = target.input
        if target.bias is not None:
            x = writer.node("Add", [x, target.bias])
        form.write(writer, x, target.output)
        written[target.nodes[0]] = writer.nodes
        graph.initializer.extend(writer.initializers)
    nodes = []
    for i, node in enumerate(graph.node):
        nodes.extend(written.get(i, []))
        if i not in removed:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    _drop_orphans(graph, removed_reads, removed_outputs)
    return out


def _read_names(graph: onnx.GraphProto) -> set[str]:
    """Tensor names the graph still reads: node inputs (subgraphs included) and graph outputs."""
    return {i for n in graph.node for i in n.input} | subgraph_reads(graph) | {o.name for o in graph.output}


def _drop_orphans(graph: onnx.GraphProto, removed_reads: set[str], removed_outputs: set[str]) -> None:
    """Remove Constant nodes and initializers only the removed nodes read, and stale value infos."""
    while True:  # a Constant chain never occurs in exports, but one pass per level is cheap
        read = _read_names(graph)
        orphans = [n for n in graph.node if n.op_type == "Constant" and n.domain in DEFAULT_DOMAINS
                   and n.output[0] in removed_reads and n.output[0] not in read]
        if not orphans:
            break
        for node in orphans:
            removed_outputs.add(node.output[0])
            graph.node.remove(node)
    read = _read_names(graph)
    graph_inputs = {i.name for i in graph.input}
    keep = [t for t in graph.initializer
            if t.name in read or t.name in graph_inputs or t.name not in removed_reads]
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)
    live = {t for n in graph.node for t in n.output}
    stale = [v for v in graph.value_info if v.name in removed_outputs and v.name not in live]
    for v in stale:
        graph.value_info.remove(v)


def _check_opset(model: onnx.ModelProto, opset: int | None, form: Form) -> None:
    model_opset = default_opset(model) or 1
    if opset is not None and opset > model_opset:
        raise ValueError(f"opset {opset} is above the model's default opset {model_opset}")
    if (opset or model_opset) < form.min_opset:
        raise ValueError(
            f"{form.flavour}/{form.form} writes {form.writes}, which needs opset {form.min_opset}; "
            f"the model is at {opset or model_opset}"
        )


def _merged_constants(constants: Mapping[str, float] | None) -> dict[str, float]:
    unknown = sorted(set(constants or {}) - CONSTANTS.keys())
    if unknown:
        raise ValueError(f"unknown constants {unknown}; known: {sorted(CONSTANTS)}")
    return {**CONSTANTS, **(constants or {})}


# ---- replacing one site ---------------------------------------------------------------------


def replace_site(
    model: onnx.ModelProto,
    site: Site,
    flavour: str,
    *,
    opset: int | None = None,
    form: str = PRIMITIVES,
    constants: Mapping[str, float] | None = None,
    elem_type: int | None = None,
) -> onnx.ModelProto:
    """A copy of `model` where `site` computes `flavour`, written as `form` (see FORMS).

    site: a Site of this model (verifiers.formats.onnx.gelu_sites.find_gelu_sites, or find_relu_sites).
    flavour: a catalogued flavour with writer forms (exact, tanh, quick, relu, identity). form: one
    of its record's forms: "primitives" (default), "gelu_op" (the flavours Gelu-20 expresses; needs
    default opset >= 20) or "erf_free" (exact). opset: the default-domain opset the
    written nodes may use; None reads the model's, and it cannot exceed the model's.
    constants: overrides for CONSTANTS (e.g. {"cubic": 0.0447}). elem_type: ONNX element type
    of the constants; None takes site.input's. A fused node's bias (FastGelu, BiasGelu) is
    kept as an Add in front. Raises ValueError when the site is not in the model, when its
    intermediate tensors are read elsewhere, or when the form is unknown or needs a newer opset.
    """
    return replace_sites(model, [(site, flavour)], opset=opset, form=form, constants=constants, elem_type=elem_type)


def replace_sites(
    model: onnx.ModelProto,
    changes: list[tuple[Site, str]],
    *,
    opset: int | None = None,
    form: str = PRIMITIVES,
    constants: Mapping[str, float] | None = None,
    elem_type: int | None = None,
) -> onnx.ModelProto:
    """`replace_site` for several (site, flavour) changes at once: one copy of the model, however
    many sites (the sites must not share nodes)."""
    placements = []
    for site, flavour in changes:
        key = (flavour, form)
        if key not in FORMS:
            raise ValueError(f"no form {form!r} for flavour {flavour!r}; known: {sorted(FORMS)}")
        _check_opset(model, opset, FORMS[key])
        placements.append((locate(model.graph, site), FORMS[key]))
    return write_forms(model, placements, _merged_constants(constants), elem_type)
