"""The activation inventory of a TFLite model: GELU and SiLU sites (measured) and ReLU sites (RELU
ops, fused RELU activations) of subgraph 0 in graph order, as `SiteFlavour`s."""

from __future__ import annotations

from pathlib import Path

from verifiers.formats.tflite.gelu_fingerprint import fingerprint_sites
from verifiers.formats.tflite.gelu_sites import measured_sites, read_graph, relu_sites
from verifiers.gelu.catalogue import RELU
from verifiers.gelu.inventory import in_graph_order, measured_flavour
from verifiers.gelu.site_flavour import SiteFlavour
from verifiers.runtimes import Runner
from verifiers.tflite_model import TFLiteModel, as_model


def tflite_inventory(model: TFLiteModel | str | Path, runner: type[Runner] | None = None) -> list[SiteFlavour]:
    """GELU and SiLU sites (measured) and ReLU sites (RELU ops, fused RELU activations) of subgraph 0."""
    graph = read_graph(as_model(model))
    gelus = [measured_flavour(p) for p in fingerprint_sites(graph, measured_sites(graph), runner)]
    relus = [SiteFlavour(site, RELU, note=site.note) for site in relu_sites(graph)]
    order = {label: i for i, label in enumerate(graph.op_labels)}
    return in_graph_order(gelus + relus, order)
