"""GELU sites in real .tflite files (Keras via the TF converter, PyTorch via litert-torch) and
what they measure when probed alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fixtures import make_broken_tflite as mbt
from verifiers.gelu import EXACT, QUICK, RELU, TANH
from verifiers.gelu.classification import FLOAT32_TOLERANCE, classify, probe_inputs
from verifiers.formats.tflite.gelu_inventory import tflite_inventory
from verifiers.formats.tflite.gelu_fingerprint import (
    fingerprint_sites,
    probe_model,
    run_probe,
)
from verifiers.formats.tflite.gelu_sites import (
    find_erf_units,
    find_tflite_relu_sites,
    find_tflite_sites,
    read_graph,
    tflite_activation_sites,
)
from verifiers.tflite_model import load_tflite

TORCH_ACTIVATIONS = {
    "nn_gelu_none": lambda: torch.nn.GELU(),
    "nn_gelu_tanh": lambda: torch.nn.GELU(approximate="tanh"),
    "erf_formula": lambda: _Lambda(lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))),
    "quick_gelu": lambda: _Lambda(lambda x: x * torch.sigmoid(1.702 * x)),
    "relu": lambda: torch.nn.ReLU(),
}


class _Lambda(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class _Mlp(torch.nn.Module):
    def __init__(self, activation):
        super().__init__()
        self.up, self.act, self.down = torch.nn.Linear(8, 16), activation, torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


@pytest.fixture(scope="module")
def litert_torch_file(tmp_path_factory):
    """convert(kind) -> path of a litert-torch conversion of Linear-act-Linear, cached per module."""
    import litert_torch

    folder, cache = tmp_path_factory.mktemp("litert_torch"), {}

    def convert(kind: str):
        if kind not in cache:
            torch.manual_seed(0)
            model = _Mlp(TORCH_ACTIVATIONS[kind]()).eval()
            path = folder / f"{kind}.tflite"
            litert_torch.convert(model, (torch.randn(2, 8),)).export(str(path))
            cache[kind] = path
        return cache[kind]

    return convert


@pytest.fixture(scope="module")
def keras_file(tmp_path_factory):
    folder, cache = tmp_path_factory.mktemp("keras_tflite"), {}

    def build(name: str):
        if name not in cache:
            cache[name] = mbt.build_fixture(name, folder).path
        return cache[name]

    return build


def _measured(path):
    return [(fp.site.op, fp.site.claimed, fp.measured, fp.classification.confident)
            for fp in fingerprint_sites(path, find_tflite_sites(path))]


@pytest.mark.parametrize("name, flavour", [("keras_exact_faithful", EXACT), ("keras_tanh_faithful", TANH)])
def test_keras_gelu_builtin(keras_file, name, flavour):
    path = keras_file(name)
    (site,) = find_tflite_sites(path)
    assert site.op == "GELU" and site.claimed == flavour and site.site_id.startswith("0:")
    assert "GeluOptions approximate=" in site.note
    assert _measured(path) == [("GELU", flavour, flavour, True)]


def test_keras_tanh_chain_with_cube_is_not_fused(keras_file):
    path = keras_file("tanh_chain_faithful")
    model = load_tflite(path)
    assert "GELU" not in {oc.name for oc in model.opcodes}
    (site,) = find_tflite_sites(path)
    assert site.op == "tanh-chain" and site.claimed == TANH and len(site.nodes) == 9
    assert _measured(path) == [("tanh-chain", TANH, TANH, True)]


def test_keras_two_sites_in_graph_order(keras_file):
    sites = find_tflite_sites(keras_file("two_gelu_faithful"))
    assert [s.site_id.split(":")[0] for s in sites] == ["0", "1"]
    assert "gelu_1" in sites[0].site_id and "gelu_2" in sites[1].site_id


@pytest.mark.parametrize("kind, flavour", [("nn_gelu_none", EXACT), ("nn_gelu_tanh", TANH)])
def test_litert_torch_nn_gelu_is_the_builtin(litert_torch_file, kind, flavour):
    path = litert_torch_file(kind)
    assert _measured(path) == [("GELU", flavour, flavour, True)]


def test_litert_torch_erf_formula_is_an_erf_chain(litert_torch_file):
    """torch.erf becomes MINIMUM/MAXIMUM clamp + rational polynomial; read as one Erf unit."""
    path = litert_torch_file("erf_formula")
    graph = read_graph(path)
    (unit,) = find_erf_units(graph)
    assert {graph.names[j] for j in unit.ops} == {"MINIMUM", "MAXIMUM", "MUL", "ADD", "DIV"}
    assert unit.error < 1e-6
    (site,) = find_tflite_sites(path)
    assert site.op == "erf-chain" and site.claimed == EXACT
    assert len(site.nodes) == len(unit.ops) + 4  # x/sqrt2, 0.5*x, 1 + erf, product
    assert "rational polynomial" in site.note
    assert _measured(path) == [("erf-chain", EXACT, EXACT, True)]


def test_litert_torch_quick_gelu_is_a_logistic_chain(litert_torch_file):
    path = litert_torch_file("quick_gelu")
    assert "LOGISTIC" in {oc.name for oc in load_tflite(path).opcodes}
    assert _measured(path) == [("sigmoid-chain", QUICK, QUICK, True)]


def test_fused_relu_is_a_relu_site(litert_torch_file):
    path = litert_torch_file("relu")
    assert find_tflite_sites(path) == []
    (site,) = find_tflite_relu_sites(path)
    assert site.op == "Relu" and site.claimed == RELU and "FULLY_CONNECTED" in site.note
    assert [(e.site.op, e.flavour) for e in tflite_inventory(path)] == [("Relu", RELU)]


def test_relu_op_and_gelu_in_graph_order(keras_file, tmp_path):
    """A RELU op standing where the second of two GELUs was."""
    content = mbt.gelu_to_relu(positions=(1,))(keras_file("two_gelu_faithful").read_bytes())
    path = tmp_path / "relu.tflite"
    path.write_bytes(content)
    sites = tflite_activation_sites(path)
    assert [(s.op, s.claimed) for s in sites] == [("GELU", EXACT), ("Relu", RELU)]
    assert sites[1].note == "RELU op"


def test_gelu_without_options_reads_exact(keras_file, tmp_path):
    path = tmp_path / "no_options.tflite"
    path.write_bytes(mbt.set_gelu_flag(None)(keras_file("keras_tanh_faithful").read_bytes()))
    (site,) = find_tflite_sites(path)
    assert site.claimed == EXACT and "no GeluOptions table" in site.note


def test_xnnpack_is_measured_too(keras_file):
    """The plain builtin kernels decide the flavour; the XNNPACK delegate is measured beside them,
    each on its own run of the probes, and the note names XNNPACK's flavour where it differs."""
    path = keras_file("keras_exact_faithful")
    graph = read_graph(path)
    (fp,) = fingerprint_sites(graph, find_tflite_sites(path))
    content, x = probe_model(graph, fp.site), probe_inputs(np.float32)
    builtin = classify(x, run_probe(content, x), FLOAT32_TOLERANCE)
    xnnpack = classify(x, run_probe(content, x, xnnpack=True), FLOAT32_TOLERANCE)
    assert fp.xnnpack == xnnpack
    assert (fp.measured, fp.classification.confident, fp.classification.residuals) == (
        builtin.flavour, builtin.confident, builtin.residuals)
    assert (fp.measured, fp.classification.confident) == (EXACT, True)
    assert (f"with XNNPACK: {xnnpack.flavour}" in fp.classification.note) == (xnnpack.flavour != EXACT)


@pytest.mark.parametrize("flushed_below", [None, -6.0], ids=["as-computed", "flushed-below-minus-6"])
def test_a_kernel_that_flushes_the_negative_tail_still_measures_exact(keras_file, flushed_below):
    """XNNPACK's GELU returns 0 for x < -6 in ai-edge-litert 2.3, where exact GELU is within 6e-9 of 0:
    whichever way a kernel treats that tail, it measures exact."""
    path = keras_file("keras_exact_faithful")
    graph = read_graph(path)
    (site,) = find_tflite_sites(path)
    x = probe_inputs(np.float32)
    y = run_probe(probe_model(graph, site), x)
    if flushed_below is not None:
        y = np.where(x < flushed_below, np.float32(0), y)
    result = classify(x, y, FLOAT32_TOLERANCE)
    assert (result.flavour, result.confident, result.tail) == (EXACT, True, "")


def test_probe_model_is_a_loadable_tflite(keras_file):
    path = keras_file("tanh_chain_faithful")
    graph = read_graph(path)
    (site,) = find_tflite_sites(path)
    probe = load_tflite_bytes(probe_model(graph, site))
    assert len(probe.subgraphs[0].operators) == len(site.nodes)


def load_tflite_bytes(content: bytes):
    from verifiers.tflite_model import parse_tflite

    return parse_tflite(content)


def test_float16_weights_keep_the_gelu_flag(tmp_path):
    """fp16-weight conversion: the GELU stays float32 with its flag and measures so."""
    import tensorflow as tf

    model = mbt._builder("functional_ops")()
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_types = [tf.float16]
    path = tmp_path / "fp16.tflite"
    path.write_bytes(converter.convert())
    assert [(e.site.op, e.flavour, e.confident) for e in tflite_inventory(path)] == [("GELU", TANH, True)]


def test_int8_site_is_measured_as_a_table(tmp_path):
    """Full int8: GELU op version 2 on int8 tensors, run on every input code; its table is the
    exact flavour's (what int8 can tell apart is the verdict's question: test_int8_gelu.py)."""
    from fixtures.make_broken_int8 import full_integer_tflite

    model = mbt._builder("functional_activation")()
    rng = np.random.default_rng(0)
    path = tmp_path / "int8.tflite"
    path.write_bytes(full_integer_tflite(model, [rng.standard_normal((1, 16)).astype(np.float32) for _ in range(8)]))
    assert ("GELU", 2) in {(oc.name, oc.version) for oc in load_tflite(path).opcodes}
    (entry,) = tflite_inventory(path)
    assert (entry.site.op, entry.flavour, entry.measured, entry.confident) == ("GELU", EXACT, EXACT, True)
    assert entry.int8.dtype == "int8" and entry.table_differences[EXACT] == 0
    assert entry.note.startswith("int8 table of exact")


def test_f_gelu_default_is_exact(litert_torch_file, tmp_path):
    """F.gelu (no approximate argument) converts like nn.GELU()."""
    import litert_torch

    torch.manual_seed(0)
    model = _Mlp(_Lambda(F.gelu)).eval()
    path = tmp_path / "f_gelu.tflite"
    litert_torch.convert(model, (torch.randn(2, 8),)).export(str(path))
    assert _measured(path) == [("GELU", EXACT, EXACT, True)]


def test_litert_torch_site_ids_show_the_users_model_not_exportgates_wrapper(tmp_path):
    """The route converts the model wrapped (to name its inputs and outputs); its site ids read as
    those of the user's model converted alone, whatever names litert-torch gives tensors."""
    import litert_torch

    from exporter import api
    from exporter.frameworks import load_source
    from fixtures.specs import torch_model

    spec = torch_model("block_exact")
    out = tmp_path / "m.tflite"
    assert api.export(spec, to="tflite", out=out).exit_code == 0
    source = load_source(spec)
    alone = tmp_path / "alone.tflite"
    litert_torch.convert(source.model, tuple(torch.from_numpy(v) for v in source.example.values())).export(str(alone))
    sites = [s["site"] for s in api.inspect(out)["gelu"]]
    assert len(sites) == 1 and sites == [s["site"] for s in api.inspect(alone)["gelu"]]
