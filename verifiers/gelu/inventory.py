"""Activation inventories: every GELU, SiLU and ReLU site of an ONNX graph or a TFLite model in
graph order, as a `SiteFlavour` with the flavour it computes (measured on the probes in the
runtime that runs the artifact, or claimed by structure)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import onnx

from verifiers.onnx_model import iter_nodes
from verifiers.runtimes import Runner
from verifiers.tflite_model import TFLiteModel, as_model

from .catalogue import RELU, Site
from .fingerprint import Fingerprint, fingerprint_sites
from verifiers.onnx_model import node_label
from .int8 import Int8Grid
from .onnx_normalize import read_through_qdq, split_duplicate_gemms
from .onnx_sites import find_activation_sites, searchable
from .site_flavour import SiteFlavour

from .tflite_fingerprint import TFLiteFingerprint
from .tflite_fingerprint import fingerprint_sites as tflite_fingerprint_sites
from .tflite_sites import measured_sites, read_graph, relu_sites


def measured_flavour(print_: Fingerprint | TFLiteFingerprint) -> SiteFlavour:
    """The flavour a site computes: measured when the probes are conclusive, else claimed."""
    site, result = print_.site, print_.classification
    int8 = {"int8": print_.int8, "table_differences": result.table_differences}
    if result.confident:
        return SiteFlavour(site, result.flavour, result.flavour, result.residuals, True, result.note,
                           result.scale, result.tail, result.samples, **int8)
    note = f"{print_.dtype} probes inconclusive ({result.note}); judged by structure: {site.claimed}"
    return SiteFlavour(site, site.claimed, result.flavour, result.residuals, False, note, site.scale,
                       samples=result.samples, **int8)


def in_graph_order(entries: list[SiteFlavour], order: dict[str, int]) -> list[SiteFlavour]:
    return sorted(entries, key=lambda e: min(order.get(label, len(order)) for label in e.site.nodes))


def onnx_inventory(model: onnx.ModelProto, runner: type[Runner] | None = None) -> list[SiteFlavour]:
    """GELU and SiLU sites (measured) and ReLU sites of an ONNX model, subgraphs and local
    functions included (read through `split_duplicate_gemms`, so a site may name the nodes that
    undo a fusion, and `read_through_qdq`: a site whose output a QDQ pair rounds carries its grid)."""
    model, quantized = read_through_qdq(split_duplicate_gemms(searchable(model)))
    sites = find_activation_sites(model)
    measured = [measured_flavour(replace(p, int8=_qdq_grid(quantized, p.site)))
                for p in fingerprint_sites(model, [s for s in sites if s.claimed != RELU], runner)]
    relus = [SiteFlavour(site, RELU) for site in sites if site.claimed == RELU]
    order = {node_label(node): i for i, node in enumerate(iter_nodes(model.graph))}
    return in_graph_order(measured + relus, order)


def _qdq_grid(grids: dict[str, Int8Grid], site: Site) -> Int8Grid | None:
    """The 8-bit grid a QDQ pair rounds the site's output to, on the grid of the pair before its
    input when there is one of the same type (else the input is float)."""
    out, before = grids.get(site.output), grids.get(site.input)
    if out is None or before is None or before.dtype != out.dtype:
        return out
    return replace(out, input_scale=before.output_scale, input_zero_point=before.output_zero_point)


def tflite_inventory(model: TFLiteModel | str | Path, runner: type[Runner] | None = None) -> list[SiteFlavour]:
    """GELU and SiLU sites (measured) and ReLU sites (RELU ops, fused RELU activations) of subgraph 0."""
    graph = read_graph(as_model(model))
    gelus = [measured_flavour(p) for p in tflite_fingerprint_sites(graph, measured_sites(graph), runner)]
    relus = [SiteFlavour(site, RELU, note=site.note) for site in relu_sites(graph)]
    order = {label: i for i, label in enumerate(graph.op_labels)}
    return in_graph_order(gelus + relus, order)


def describe_sites(entries: list[SiteFlavour]) -> list[dict]:
    """The GELU sites as `inspect` lists them: site, op, claimed, measured, residuals, and for an 8-bit
    site its quantization (int8) and, measured as a table, the entries off per flavour."""
    return [
        {"site": e.site.site_id, "op": e.site.op, "claimed": e.site.claimed, "measured": e.measured,
         "confident": e.confident, "scale": e.scale, "tail": e.tail, "used": e.site.used,
         "residuals": e.residuals, "note": e.note, "int8": e.int8.to_dict() if e.int8 else None,
         "table_differences": e.table_differences}
        for e in entries if not _is_relu(e.site)
    ]


def _is_relu(site: Site) -> bool:
    return site.claimed == RELU and site.op == "Relu"
