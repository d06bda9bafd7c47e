"""Activation inventories, whatever the format: the flavour a fingerprinted site computes, graph
order, and how `inspect` lists the sites. Each format's inventory (every GELU, SiLU and ReLU site
in graph order, measured on the probes in the runtime that runs the artifact, or claimed by
structure) is in its package: verifiers.formats.onnx.gelu_inventory, verifiers.formats.tflite.gelu_inventory."""

from __future__ import annotations

from verifiers.gelu.catalogue import RELU, Site
from verifiers.gelu.site_flavour import SiteFlavour


def measured_flavour(print_) -> SiteFlavour:
    """The flavour a site computes: measured when the probes are conclusive, else claimed (`print_`:
    a format's fingerprint of the site: its site, classification, dtype and int8 grid)."""
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
