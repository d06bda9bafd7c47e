"""GELU rewrites on an onnx.ModelProto: swap one site's flavour, lower Gelu-20 to primitives, or
fuse chains into Gelu-20.

Three rewrites, each on the top-level graph only, each returning a new model (the input is
never mutated), both keeping the model valid (`onnx.checker.check_model(full_check=True)`):

  replace_site(model, site, flavour)
      matches  one GELU site as `verifiers.formats.onnx.gelu_sites.find_gelu_sites` reports it: its nodes, reading
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

The forms each flavour is written in (`FORMS`, `CONSTANTS`) and `replace_site` live in
verifiers.formats.onnx.gelu_writer, next to the catalogue they read: the guard writes variants with them too.
"""

from __future__ import annotations

import onnx

from verifiers.gelu.catalogue import FLAVOURS, GELU_OP, PRIMITIVES, Site, gelu20_flavour
from verifiers.formats.onnx.gelu_fingerprint import fingerprint_sites
from verifiers.onnx_model import node_attrs, node_label
from verifiers.formats.onnx.gelu_sites import find_gelu_sites
from verifiers.formats.onnx.gelu_writer import (
    CONSTANTS,
    ERF_FREE,
    FORMS,
    GELU_OP_MIN_OPSET,
    Form,
    locate,
    replace_site,
    write_forms,
)
from verifiers.onnx_model import DEFAULT_DOMAINS, default_opset

__all__ = [
    "CHAIN_OPS", "CONSTANTS", "ERF_FREE", "FORMS", "GELU_OP", "PRIMITIVES", "Form", "decompose_gelu_ops",
    "fuse_gelu_chains", "gelu_op_sites", "replace_site",
]

# The flavours a Gelu-20 node computes (by its approximate attribute), from the catalogue.
_GELU20_FLAVOURS = tuple(f.name for f in FLAVOURS.values() if f.gelu20_approximate is not None)


def gelu_op_sites(model: onnx.ModelProto) -> list[Site]:
    """Every default-domain Gelu node of the top-level graph as a Site (claimed from approximate)."""
    sites = []
    for node in model.graph.node:
        if node.op_type == "Gelu" and node.domain in DEFAULT_DOMAINS:
            approximate = node_attrs(node).get("approximate", "none")
            claimed = gelu20_flavour(approximate)
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
    # each flavour's primitives, or the form its record writes where Erf cannot run
    forms = {name: FORMS[name, PRIMITIVES if exact_form == PRIMITIVES else FLAVOURS[name].no_erf_form]
             for name in _GELU20_FLAVOURS}
    placements = [(locate(model.graph, s), forms[s.claimed]) for s in gelu_op_sites(model)]
    return write_forms(model, placements, CONSTANTS, None)


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
    sites = [s for s in find_gelu_sites(model) if s.op in CHAIN_OPS and s.claimed in _GELU20_FLAVOURS]
    certain = [p.site for p in fingerprint_sites(model, sites)
               if p.classification.confident and p.measured == p.site.claimed]
    placements = [(locate(model.graph, s), FORMS[s.claimed, GELU_OP]) for s in certain]
    return write_forms(model, placements, CONSTANTS, None)
