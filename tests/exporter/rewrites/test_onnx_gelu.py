"""GELU rewrites on real torch.onnx exports: each result is valid and computes what was asked."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper, version_converter

from exporter.rewrites import CONSTANTS, decompose_gelu_ops, replace_site
from fixtures.models import torch_models
from verifiers.gelu import EXACT, IDENTITY, QUICK, RELU, TANH, UNKNOWN, Site
from verifiers.formats.onnx.gelu_sites import find_gelu_sites, find_relu_sites
from verifiers.formats.onnx.gelu_fingerprint import fingerprint_sites

# (exporter, opset): the TorchScript exporter writes chains at 17 and Gelu at 20; dynamo at 18
# writes chains with constants as initializers and its weights as external data.
EXPORTS = {"ts17": (False, 17), "ts20": (False, 20), "dynamo18": (True, 18)}
SOURCES = {EXACT: "mlp_exact", TANH: "mlp_tanh"}


class _Quick(torch.nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


TORCH_ACTIVATIONS = {
    EXACT: lambda: torch.nn.GELU(),
    TANH: lambda: torch.nn.GELU(approximate="tanh"),
    QUICK: _Quick,
    RELU: torch.nn.ReLU,
    IDENTITY: torch.nn.Identity,
}

# Max abs output difference of the fixture MLP when its exact GELU becomes each flavour,
# as (low, high): the flavours are 4.7e-4 (tanh), 2e-2 (quick), 0.17 (relu) apart.
CHANGE = {EXACT: (0.0, 1e-6), TANH: (2e-5, 1e-3), QUICK: (1e-3, 5e-2), RELU: (5e-2, 1.0), IDENTITY: (5e-2, 5.0)}


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """export(flavour, key) -> (ModelProto, torch model, input array), cached per module."""
    folder = tmp_path_factory.mktemp("rewrites")
    cache = {}

    def build(flavour: str, key: str):
        if (flavour, key) not in cache:
            dynamo, opset = EXPORTS[key]
            model, (x,) = getattr(torch_models, SOURCES[flavour])()
            x = x * 2.0  # reach |x| of 3 and more, where the flavours differ
            path = folder / f"{flavour}_{key}.onnx"
            torch.onnx.export(model, (x,), str(path), opset_version=opset, dynamo=dynamo,
                              input_names=["x"], output_names=["y"])
            cache[flavour, key] = (onnx.load(str(path)), model, x.numpy())
        return cache[flavour, key]

    return build


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def swapped(model: torch.nn.Sequential, flavour: str, x: np.ndarray) -> np.ndarray:
    """The torch MLP with its activation replaced by `flavour`."""
    with torch.no_grad():
        return torch.nn.Sequential(model[0], TORCH_ACTIVATIONS[flavour](), model[2])(torch.from_numpy(x)).numpy()


def measured(model: onnx.ModelProto) -> list[tuple[str, str, bool]]:
    sites = find_gelu_sites(model)
    return [(s.op, f.measured, f.classification.confident) for s, f in zip(sites, fingerprint_sites(model, sites))]


def assert_valid(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)
    names = [n.name for n in model.graph.node]
    assert len(names) == len(set(names)), "node names must stay unique"


@pytest.mark.parametrize("key", list(EXPORTS))
@pytest.mark.parametrize(
    ("source", "target"),
    [(EXACT, TANH), (EXACT, QUICK), (EXACT, RELU), (EXACT, IDENTITY), (EXACT, EXACT), (TANH, EXACT)],
)
def test_replace_site_computes_the_requested_flavour(export, key, source, target):
    original, torch_model, x = export(source, key)
    [site] = find_gelu_sites(original)
    rewritten = replace_site(original, site, target)
    assert_valid(rewritten)

    if target in (EXACT, TANH, QUICK):
        [(_, flavour, confident)] = measured(rewritten)
        assert (flavour, confident) == (target, True)
    elif target == RELU:
        assert find_gelu_sites(rewritten) == []
        [fp] = fingerprint_sites(rewritten, find_relu_sites(rewritten))
        assert fp.measured == RELU
    else:
        assert find_gelu_sites(rewritten) == []
        [node] = [n for n in rewritten.graph.node if n.op_type == "Identity"]
        assert (node.input[0], node.output[0]) == (site.input, site.output)
        [fp] = fingerprint_sites(rewritten, [Site("0:id", "Identity", IDENTITY, (node.name,), site.input, site.output)])
        assert fp.measured == IDENTITY

    y0, y1 = run(original, x), run(rewritten, x)
    np.testing.assert_allclose(y1, swapped(torch_model, target, x), atol=1e-5)
    low, high = CHANGE[EXACT if source == target else TANH if {source, target} == {EXACT, TANH} else target]
    assert low <= float(np.abs(y1 - y0).max()) <= high


def test_site_nodes_and_their_constants_are_removed(export):
    original, _, _ = export(EXACT, "ts17")
    [site] = find_gelu_sites(original)
    rewritten = replace_site(original, site, TANH)
    labels = {n.name for n in rewritten.graph.node}
    assert not labels & set(site.nodes)
    read = {i for n in rewritten.graph.node for i in n.input}
    assert all(n.output[0] in read for n in rewritten.graph.node if n.op_type == "Constant")
    assert {n.op_type for n in rewritten.graph.node} == {"Gemm", "Mul", "Add", "Tanh"}


def test_dynamo_initializers_only_the_site_read_are_removed(export):
    original, _, _ = export(EXACT, "dynamo18")
    [site] = find_gelu_sites(original)
    rewritten = replace_site(original, site, RELU)
    read = {i for n in rewritten.graph.node for i in n.input}
    assert all(t.name in read for t in rewritten.graph.initializer)
    assert {t.name for t in original.graph.initializer} - {t.name for t in rewritten.graph.initializer}


def test_input_is_not_mutated_and_output_is_deterministic(export):
    original, _, _ = export(EXACT, "ts17")
    before = original.SerializeToString()
    [site] = find_gelu_sites(original)
    first, second = replace_site(original, site, TANH), replace_site(original, site, TANH)
    assert original.SerializeToString() == before
    assert first.SerializeToString() == second.SerializeToString()
    # The written nodes are named under the site's first node and the flavour written.
    assert [n.name for n in first.graph.node if n.op_type == "Tanh"] == [f"{site.nodes[0]}/tanh/Tanh"]


def test_tanh_chain_has_no_pow(export):
    original, _, _ = export(EXACT, "ts17")
    rewritten = replace_site(original, find_gelu_sites(original)[0], TANH)
    assert "Pow" not in {n.op_type for n in rewritten.graph.node}


@pytest.mark.parametrize(("source", "target"), [(EXACT, TANH), (TANH, EXACT)])
def test_gelu_op_form_at_opset_20(export, source, target):
    original, torch_model, x = export(source, "ts20")
    rewritten = replace_site(original, find_gelu_sites(original)[0], target, form="gelu_op")
    assert_valid(rewritten)
    [node] = [n for n in rewritten.graph.node if n.op_type == "Gelu"]
    assert helper.get_attribute_value(node.attribute[0]) == {EXACT: b"none", TANH: b"tanh"}[target]
    assert measured(rewritten) == [("Gelu", target, True)]
    np.testing.assert_allclose(run(rewritten, x), swapped(torch_model, target, x), atol=1e-5)


def test_gelu_op_form_below_opset_20_is_refused(export):
    original, _, _ = export(EXACT, "ts17")
    site = find_gelu_sites(original)[0]
    with pytest.raises(ValueError, match="needs opset 20"):
        replace_site(original, site, TANH, form="gelu_op")
    with pytest.raises(ValueError, match="above the model's"):
        replace_site(original, site, TANH, opset=20)


def test_constant_override_writes_the_0_0447_typo(export):
    original, _, _ = export(TANH, "ts17")
    rewritten = replace_site(original, find_gelu_sites(original)[0], TANH, constants={"cubic": 0.0447})
    assert_valid(rewritten)
    sites = find_gelu_sites(rewritten)
    [fp] = fingerprint_sites(rewritten, sites)
    assert sites[0].claimed == UNKNOWN and "cubic coeff" in sites[0].note
    assert (fp.measured, fp.classification.confident) == (UNKNOWN, True)
    assert 8e-6 < fp.classification.residuals[TANH] < 9.5e-6


def test_bad_requests_are_refused(export):
    original, _, _ = export(EXACT, "ts17")
    site = find_gelu_sites(original)[0]
    with pytest.raises(ValueError, match="no form"):
        replace_site(original, site, "swish")
    with pytest.raises(ValueError, match="unknown constants"):
        replace_site(original, site, TANH, constants={"cubic_coeff": 0.0447})
    other, _, _ = export(EXACT, "dynamo18")
    with pytest.raises(ValueError, match="not in this model"):
        replace_site(other, site, TANH)


def test_a_relu_site_can_be_restored_to_exact(export):
    original, _, x = export(EXACT, "ts17")
    broken = replace_site(original, find_gelu_sites(original)[0], RELU)
    restored = replace_site(broken, find_relu_sites(broken)[0], EXACT)
    assert measured(restored) == [("erf-chain", EXACT, True)]
    np.testing.assert_allclose(run(restored, x), run(original, x), atol=1e-6)


def _fused_bias_model(op_type: str) -> tuple[onnx.ModelProto, np.ndarray]:
    bias = np.linspace(-1, 1, 8).astype(np.float32)
    node = helper.make_node(op_type, ["x", "bias"], ["y"], name="fused", domain="com.microsoft")
    graph = helper.make_graph(
        [node], "fused", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])], [numpy_helper.from_array(bias, "bias")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return model, bias


@pytest.mark.parametrize("op_type", ["FastGelu", "BiasGelu"])
def test_a_fused_sites_bias_is_kept(op_type):
    model, bias = _fused_bias_model(op_type)
    [site] = find_gelu_sites(model)
    rewritten = replace_site(model, site, QUICK)
    assert_valid(rewritten)
    x = np.linspace(-4, 4, 32, dtype=np.float32).reshape(4, 8)
    z = (x + bias).astype(np.float64)
    np.testing.assert_allclose(run(rewritten, x), z / (1 + np.exp(-1.702 * z)), atol=1e-5)


def test_constants_follow_the_site_dtype():
    graph = helper.make_graph(
        [helper.make_node("Gelu", ["x"], ["h"], name="g1", approximate="tanh"),
         helper.make_node("Gelu", ["h"], ["y"], name="g2")],
        "fp16", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["n", 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    decomposed = decompose_gelu_ops(model)
    assert_valid(decomposed)
    assert {t.data_type for t in decomposed.graph.initializer} == {TensorProto.FLOAT16}
    # float16 outputs cannot separate exact from tanh: the structure (claimed) does.
    assert [(s.op, s.claimed) for s in find_gelu_sites(decomposed)] == [("tanh-chain", TANH), ("erf-chain", EXACT)]
    assert all(flavour in (EXACT, TANH) for _, flavour, _ in measured(decomposed))


@pytest.mark.parametrize("source", [EXACT, TANH])
def test_decompose_gelu_ops_keeps_outputs_and_lets_the_model_go_below_20(export, source):
    original, _, x = export(source, "ts20")
    assert measured(original) == [("Gelu", source, True)]
    with pytest.raises(RuntimeError, match="No Previous Version of Gelu"):
        version_converter.convert_version(original, 17)

    decomposed = decompose_gelu_ops(original)
    assert_valid(decomposed)
    assert "Gelu" not in {n.op_type for n in decomposed.graph.node}
    assert [o.version for o in decomposed.opset_import if o.domain == ""] == [20]
    assert [(f, c) for _, f, c in measured(decomposed)] == [(source, True)]
    y0 = run(original, x)
    np.testing.assert_allclose(run(decomposed, x), y0, atol=1e-6, rtol=0)

    lowered = version_converter.convert_version(decomposed, 17)
    assert_valid(lowered)
    assert [o.version for o in lowered.opset_import if o.domain == ""] == [17]
    np.testing.assert_allclose(run(lowered, x), y0, atol=1e-6, rtol=0)


def test_decompose_without_gelu_is_a_copy(export):
    original, _, _ = export(EXACT, "ts17")
    assert decompose_gelu_ops(original).SerializeToString() == original.SerializeToString()


def test_catalogue_constants_are_the_defaults():
    assert CONSTANTS["cubic"] == 0.044715 and CONSTANTS["quick_alpha"] == 1.702
