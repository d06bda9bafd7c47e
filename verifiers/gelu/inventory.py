"""Activation inventories: every GELU, SiLU and ReLU site of an ONNX graph or a TFLite model in
graph order, as a `SiteFlavour` with the flavour it computes (measured on the probes in the
runtime that runs the artifact, or claimed by structure)."""

from __future__ import annotations

from pathlib import Path

import onnx

from verifiers.onnx_model import iter_nodes
from verifiers.runtimes import Runner
from verifiers.tflite_model import TFLiteModel, as_model

from .catalogue import RELU, Site, SiteFlavour
from .fingerprint import Fingerprint, fingerprint_sites
from .onnx_graph import node_label
from .onnx_normalize import split_duplicate_gemms
from .onnx_sites import find_activation_sites, searchable

from .tflite_fingerprint import TFLiteFingerprint
from .tflite_fingerprint import fingerprint_sites as tflite_fingerprint_sites
from .tflite_sites import measured_sites, read_graph, relu_sites


def measured_flavour(print_: Fingerprint | TFLiteFingerprint) -> SiteFlavour:
    """The flavour a site computes: measured when the probes are conclusive, else claimed."""
    site, result = print_.site, print_.classification
    if result.confident:
        return SiteFlavour(site, result.flavour, result.flavour, result.residuals, True, result.note,
                           result.scale, result.tail, result.samples)
    note = f"{print_.dtype} probes inconclusive ({result.note}); judged by structure: {site.claimed}"
    return SiteFlavour(site, site.claimed, result.flavour, result.residuals, False, note, site.scale,
                       samples=result.samples)


def in_graph_order(entries: list[SiteFlavour], order: dict[str, int]) -> list[SiteFlavour]:
    return sorted(entries, key=lambda e: min(order.get(label, len(order)) for label in e.site.nodes))


def onnx_inventory(model: onnx.ModelProto, runner: type[Runner] | None = None) -> list[SiteFlavour]:
    """GELU and SiLU sites (measured) and ReLU sites of an ONNX model, subgraphs and local
    functions included (read through `split_duplicate_gemms`, so a site may name the nodes that
    undo a fusion)."""
    model = split_duplicate_gemms(searchable(model))
    sites = find_activation_sites(model)
    measured = [measured_flavour(p) for p in fingerprint_sites(model, [s for s in sites if s.claimed != RELU], runner)]
    relus = [SiteFlavour(site, RELU) for site in sites if site.claimed == RELU]
    order = {node_label(node): i for i, node in enumerate(iter_nodes(model.graph))}
    return in_graph_order(measured + relus, order)


def tflite_inventory(model: TFLiteModel | str | Path, runner: type[Runner] | None = None) -> list[SiteFlavour]:
    """GELU and SiLU sites (measured) and ReLU sites (RELU ops, fused RELU activations) of subgraph 0."""
    graph = read_graph(as_model(model))
    gelus = [measured_flavour(p) for p in tflite_fingerprint_sites(graph, measured_sites(graph), runner)]
    relus = [SiteFlavour(site, RELU, note=site.note) for site in relu_sites(graph)]
    order = {label: i for i, label in enumerate(graph.op_labels)}
    return in_graph_order(gelus + relus, order)


def describe_sites(entries: list[SiteFlavour]) -> list[dict]:
    """The GELU sites as `inspect` lists them: site, op, claimed, measured, residuals."""
    return [
        {"site": e.site.site_id, "op": e.site.op, "claimed": e.site.claimed, "measured": e.measured,
         "confident": e.confident, "scale": e.scale, "tail": e.tail, "used": e.site.used,
         "residuals": e.residuals, "note": e.note}
        for e in entries if not _is_relu(e.site)
    ]


def _is_relu(site: Site) -> bool:
    return site.claimed == RELU and site.op == "Relu"
