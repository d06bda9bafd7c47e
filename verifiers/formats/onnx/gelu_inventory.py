"""The activation inventory of an ONNX model: every GELU, SiLU and ReLU site in graph order, as a
`SiteFlavour` with the flavour it computes (measured on the probes in the runtime that runs the
artifact, or claimed by structure)."""

from __future__ import annotations

from dataclasses import replace

import onnx

from verifiers.formats.onnx.gelu_fingerprint import fingerprint_sites
from verifiers.formats.onnx.gelu_normalize import read_through_qdq, split_duplicate_gemms
from verifiers.formats.onnx.gelu_sites import find_activation_sites, searchable
from verifiers.gelu.catalogue import RELU, Site
from verifiers.gelu.int8 import Int8Grid
from verifiers.gelu.inventory import in_graph_order, measured_flavour
from verifiers.gelu.site_flavour import SiteFlavour
from verifiers.onnx_model import iter_nodes, node_label
from verifiers.runtimes import Runner


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
