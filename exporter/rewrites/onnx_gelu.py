"""GELU rewrites on an onnx.ModelProto: swap one site's flavour, lower Gelu-20 to primitives, or
fuse chains into Gelu-20.

Three rewrites, each on the top-level graph only, each returning a new model (the input is
never mutated), both keeping the model valid (`onnx.checker.check_model(full_check=True)`):

  replace_site(model, site, flavour)
      matches  one GELU site as `verifiers.gelu.find_gelu_sites` reports it: its nodes, reading
               `site.input` and writing `site.output` (a fused node's bias input included);
      writes   a fresh implementation of `flavour` from site.input to site.output, where the
               site's first node stood; the site's nodes go, and so do the Constant nodes and
               scalar initializers that only they read.
  decompose_gelu_ops(model, exact_form="primitives" | "erf_free")
      matches  every Gelu node of the default domain (opset 20+);
      writes   the erf chain (or the Erf-free exact form) for approximate='none', the tanh
               chain for 'tanh', in its place, so `onnx.version_converter` can take the model
               below opset 20 (it has no adapter that lowers Gelu-20).
  fuse_gelu_chains(model)
      matches  every erf/tanh chain site whose claimed flavour the fingerprint confirms;
      writes   one Gelu(approximate='none' | 'tanh') in its place (opset 20+).

What each flavour is written as is a `Form` in `FORMS`, keyed (flavour, form):

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

Constants are scalar initializers in the element type of site.input (declared, else
inferred, else float32). `constants=` overrides catalogue values by key (see `CONSTANTS`),
which is how a fixture writes the tanh chain with the 0.0447 typo.

New nodes and tensors are named "{site's first node}/{flavour}/{op}" (made unique against
every existing name), so rewriting the same model twice gives the same graph.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import onnx
from onnx import helper

from verifiers.gelu.catalogue import (
    EXACT,
    IDENTITY,
    QUICK,
    QUICK_ALPHA,
    RELU,
    SQRT_2_OVER_PI,
    TANH,
    TANH_CUBIC_COEFF,
    Site,
)
from verifiers.gelu.fingerprint import fingerprint_sites
from verifiers.gelu.onnx_graph import node_attrs, node_label, subgraph_reads
from verifiers.gelu.onnx_sites import find_gelu_sites
from verifiers.onnx_model import DEFAULT_DOMAINS, default_opset, elem_types

GELU_OP_MIN_OPSET = 20
PRIMITIVES = "primitives"
GELU_OP = "gelu_op"

# Catalogue constants the primitive forms use, by the key `constants=` overrides them with.
CONSTANTS: dict[str, float] = {
    "half": 0.5,  # the 0.5 of 0.5*x*(1+...)
    "one": 1.0,  # the 1 of 1+erf / 1+tanh
    "sqrt2": math.sqrt(2.0),  # exact: erf(x / sqrt2)
    "tanh_scale": SQRT_2_OVER_PI,  # tanh: sqrt(2/pi)
    "cubic": TANH_CUBIC_COEFF,  # tanh: 0.044715 (the "0.0447 typo" overrides this)
    "quick_alpha": QUICK_ALPHA,  # quick: x*sigmoid(1.702x)
    # exact/erf_free: Abramowitz & Stegun 7.1.26, erf(z) ~ 1 - (a1 t + ... + a5 t^5) exp(-z^2),
    # t = 1/(1 + p z), z >= 0, max error 1.5e-7.
    "as_p": 0.3275911,
    "as_a1": 0.254829592,
    "as_a2": -0.284496736,
    "as_a3": 1.421413741,
    "as_a4": -1.453152027,
    "as_a5": 1.061405429,
}
ERF_FREE = "erf_free"


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


FORMS: dict[tuple[str, str], Form] = {
    (f.flavour, f.form): f
    for f in (
        Form(EXACT, PRIMITIVES, "Div(x, sqrt2) / Erf / Add 1 / Mul x / Mul 0.5", _exact_primitives),
        Form(EXACT, GELU_OP, "Gelu(approximate='none')", _gelu_op("none"), GELU_OP_MIN_OPSET),
        Form(EXACT, ERF_FREE, "Div(x, sqrt2) / erf(z) = q(Relu(-z)) - q(Relu(z)), q(u) = A&S 7.1.26 "
             "polynomial(1/(1+p u)) * Exp(-u*u) / Add 1 / Mul x / Mul 0.5 (no Erf, no Sign)", _exact_erf_free),
        Form(TANH, PRIMITIVES, "x*x*x / Mul 0.044715 / Add x / Mul sqrt(2/pi) / Tanh / Add 1 / Mul x / Mul 0.5",
             _tanh_primitives),
        Form(TANH, GELU_OP, "Gelu(approximate='tanh')", _gelu_op("tanh"), GELU_OP_MIN_OPSET),
        Form(QUICK, PRIMITIVES, "Mul 1.702 / Sigmoid / Mul x", _quick_primitives),
        Form(RELU, PRIMITIVES, "Relu", _relu),
        Form(IDENTITY, PRIMITIVES, "Identity (the activation removed)", _identity),
    )
}


# ---- graph helpers ------------------------------------------------------------------------


def _read_names(graph: onnx.GraphProto) -> set[str]:
    """Tensor names the graph still reads: node inputs (subgraphs included) and graph outputs."""
    return {i for n in graph.node for i in n.input} | subgraph_reads(graph) | {o.name for o in graph.output}


def _all_names(graph: onnx.GraphProto) -> set[str]:
    """Node names and tensor names in use at the top level (for fresh-name generation)."""
    names = {n.name for n in graph.node} | {t for n in graph.node for t in (*n.input, *n.output)}
    names |= {t.name for t in graph.initializer} | {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
    return names - {""}


@dataclass(frozen=True)
class _Target:
    """Where one rewrite applies: node indices to remove, the tensor read, the tensor written."""

    nodes: tuple[int, ...]
    input: str
    output: str
    bias: str | None
    prefix: str


def _locate(graph: onnx.GraphProto, site: Site) -> _Target:
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
    return _Target(nodes, site.input, site.output, bias, site.nodes[0])


def _apply(model: onnx.ModelProto, targets: list[tuple[_Target, Form]],
           constants: Mapping[str, float], elem_type: int | None) -> onnx.ModelProto:
    """Copy the model, write each target's form in its place, then drop what only they read."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    taken = _all_names(graph)
    types = elem_types(model, {t.input for t, _ in targets}) if elem_type is None else {}
    removed = {i for t, _ in targets for i in t.nodes}
    removed_reads = {name for i in removed for name in graph.node[i].input}
    removed_outputs = {name for i in removed for name in graph.node[i].output}
    written: dict[int, list[onnx.NodeProto]] = {}
    for target, form in targets:
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


# ---- the rewrites -------------------------------------------------------------------------


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

    site: a Site of this model (verifiers.gelu.find_gelu_sites, or find_relu_sites).
    flavour: exact, tanh, quick, relu or identity. form: "primitives" (default) or "gelu_op"
    (exact and tanh only; needs default opset >= 20). opset: the default-domain opset the
    written nodes may use; None reads the model's, and it cannot exceed the model's.
    constants: overrides for CONSTANTS (e.g. {"cubic": 0.0447}). elem_type: ONNX element type
    of the constants; None takes site.input's. A fused node's bias (FastGelu, BiasGelu) is
    kept as an Add in front. Raises ValueError when the site is not in the model, when its
    intermediate tensors are read elsewhere, or when the form is unknown or needs a newer opset.
    """
    key = (flavour, form)
    if key not in FORMS:
        raise ValueError(f"no form {form!r} for flavour {flavour!r}; known: {sorted(FORMS)}")
    _check_opset(model, opset, FORMS[key])
    merged = _merged_constants(constants)
    return _apply(model, [(_locate(model.graph, site), FORMS[key])], merged, elem_type)


def gelu_op_sites(model: onnx.ModelProto) -> list[Site]:
    """Every default-domain Gelu node of the top-level graph as a Site (claimed from approximate)."""
    sites = []
    for node in model.graph.node:
        if node.op_type == "Gelu" and node.domain in DEFAULT_DOMAINS:
            approximate = node_attrs(node).get("approximate", "none")
            claimed = {"none": EXACT, "tanh": TANH}.get(approximate)
            if claimed is None:
                raise ValueError(f"Gelu node {node_label(node)!r}: unknown approximate={approximate!r}")
            sites.append(Site(f"{len(sites)}:{node_label(node)}", "Gelu", claimed, (node_label(node),),
                              node.input[0], node.output[0], f"approximate='{approximate}'"))
    return sites


def decompose_gelu_ops(model: onnx.ModelProto, exact_form: str = PRIMITIVES) -> onnx.ModelProto:
    """A copy of `model` with every Gelu-20 node written as primitives of its own flavour.

    approximate='none' -> the exact form `exact_form`: "primitives" (the erf chain) or
    "erf_free" (the same chain with erf written as Abramowitz & Stegun 7.1.26 in Relu/Neg/Mul/
    Add/Div/Exp/Sub, for runtimes without Erf); 'tanh' -> the tanh chain (x*x*x cube). Each is
    written where the Gelu stood, reading and writing the same tensors. Opset imports are left
    as they are (the chains are valid at every opset >= 13), so the result converts down with
    onnx.version_converter. A model without Gelu nodes comes back as an unchanged copy.
    """
    if exact_form not in (PRIMITIVES, ERF_FREE):
        raise ValueError(f"exact_form must be {PRIMITIVES!r} or {ERF_FREE!r}, not {exact_form!r}")
    forms = {EXACT: FORMS[(EXACT, exact_form)], TANH: FORMS[(TANH, PRIMITIVES)]}
    targets = [(_locate(model.graph, s), forms[s.claimed]) for s in gelu_op_sites(model)]
    return _apply(model, targets, CONSTANTS, None)


CHAIN_OPS = ("erf-chain", "tanh-chain")


def fuse_gelu_chains(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with every erf/tanh chain of certain flavour as one Gelu-20 node.

    A chain is fused when `find_gelu_sites` claims it exact (erf-chain, including erf written
    out, e.g. the erf_free form) or tanh (tanh-chain) and `fingerprint_sites` measures the same
    flavour, confidently: float16 chains, chains with off constants and chains the probe cannot
    run stay as they are. The Gelu node (approximate='none' | 'tanh') reads the chain's input and
    writes its output, where the chain's first node stood; the chain's nodes and the constants
    only they read go. Outputs stay within 1e-6 of the chain's (float32). Raises ValueError when
    the model's default opset is below 20 (Gelu is an opset-20 op). A model without such chains
    comes back as an unchanged copy.
    """
    model_opset = default_opset(model) or 1
    if model_opset < GELU_OP_MIN_OPSET:
        raise ValueError(f"fusing GELU chains writes Gelu, which needs opset {GELU_OP_MIN_OPSET}; "
                         f"the model is at {model_opset}")
    sites = [s for s in find_gelu_sites(model) if s.op in CHAIN_OPS and s.claimed in (EXACT, TANH)]
    certain = [p.site for p in fingerprint_sites(model, sites)
               if p.classification.confident and p.measured == p.site.claimed]
    targets = [(_locate(model.graph, s), FORMS[(s.claimed, GELU_OP)]) for s in certain]
    return _apply(model, targets, CONSTANTS, None)
