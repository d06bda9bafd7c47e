"""Activation inventories: every GELU, SiLU and ReLU site of an ONNX graph in graph order, as a
`SiteFlavour` with the flavour it computes (measured, or claimed by structure). The TFLite one is
`tflite_fingerprint.tflite_inventory`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx

from verifiers.onnx_model import iter_nodes

from .catalogue import RELU, Site, SiteFlavour
from .fingerprint import Fingerprint, fingerprint_sites
from .onnx_graph import node_label
from .onnx_normalize import split_duplicate_gemms
from .onnx_sites import find_activation_sites, searchable

if TYPE_CHECKING:
    from .tflite_fingerprint import TFLiteFingerprint


def measured_flavour(print_: Fingerprint | TFLiteFingerprint) -> SiteFlavour:
    """The flavour a site computes: measured when the probes are conclusive, else claimed."""
    site, result = print_.site, print_.classification
    if result.confident:
        return SiteFlavour(site, result.flavour, result.flavour, result.residuals, True, result.note,
                           result.scale, result.tail)
    note = f"{print_.dtype} probes inconclusive ({result.note}); judged by structure: {site.claimed}"
    return SiteFlavour(site, site.claimed, result.flavour, result.residuals, False, note, site.scale)


def in_graph_order(entries: list[SiteFlavour], order: dict[str, int]) -> list[SiteFlavour]:
    return sorted(entries, key=lambda e: min(order.get(label, len(order)) for label in e.site.nodes))


def onnx_inventory(model: onnx.ModelProto) -> list[SiteFlavour]:
    """GELU and SiLU sites (measured) and ReLU sites of an ONNX model, subgraphs and local
    functions included (read through `split_duplicate_gemms`, so a site may name the nodes that
    undo a fusion)."""
    model = split_duplicate_gemms(searchable(model))
    sites = find_activation_sites(model)
    measured = [measured_flavour(p) for p in fingerprint_sites(model, [s for s in sites if s.claimed != RELU])]
    relus = [SiteFlavour(site, RELU) for site in sites if site.claimed == RELU]
    order = {node_label(node): i for i, node in enumerate(iter_nodes(model.graph))}
    return in_graph_order(measured + relus, order)


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
