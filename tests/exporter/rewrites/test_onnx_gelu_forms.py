"""GELU forms for targets: chains fused into Gelu-20, and exact GELU without Erf (A&S 7.1.26),
each computing what it replaced and recognised by the guard as the same flavour."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, version_converter

from exporter.rewrites import (
    CONSTANTS,
    ERF_FREE,
    FORMS,
    decompose_gelu_ops,
    fuse_gelu_chains,
    replace_site,
)
from fixtures.models import torch_models
from verifiers.gelu import EXACT, TANH, UNKNOWN
from verifiers.formats.onnx.gelu_sites import find_gelu_sites, find_relu_sites
from verifiers.formats.onnx.gelu_fingerprint import fingerprint_sites
from verifiers.gelu.catalogue import exact
from verifiers.gelu.chains import find_erf_units
from verifiers.formats.onnx.gelu_inventory import onnx_inventory
from verifiers.formats.onnx.gelu_sites import _chain_graph

ERF_FREE_OPS = {"Div", "Relu", "Neg", "Mul", "Add", "Exp", "Sub"}
GRID = np.linspace(-10.0, 10.0, 200001)


def gelu_model(approximates: list[str], elem_type: int = TensorProto.FLOAT, opset: int = 20) -> onnx.ModelProto:
    """x -> Gelu -> Gelu ... -> y, one Gelu-20 per entry."""
    names = ["x", *[f"h{k}" for k in range(len(approximates) - 1)], "y"]
    nodes = [helper.make_node("Gelu", [names[k]], [names[k + 1]], name=f"gelu{k}", approximate=a)
             for k, a in enumerate(approximates)]
    graph = helper.make_graph(nodes, "gelus", [helper.make_tensor_value_info("x", elem_type, ["n"])],
                              [helper.make_tensor_value_info("y", elem_type, ["n"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run(model: onnx.ModelProto, x: np.ndarray, outputs: list[str] | None = None) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(outputs, {session.get_inputs()[0].name: x})


def flavours(model: onnx.ModelProto) -> list[tuple[str, str, str, bool]]:
    sites = find_gelu_sites(model)
    return [(s.op, s.claimed, f.measured, f.classification.confident)
            for s, f in zip(sites, fingerprint_sites(model, sites))]


def assert_valid(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)
    names = [n.name for n in model.graph.node]
    assert len(names) == len(set(names))


@pytest.fixture(scope="module")
def torch_export(tmp_path_factory):
    """export(builder, opset) -> (ModelProto, input) of a TorchScript export, cached per module."""
    folder, cache = tmp_path_factory.mktemp("forms"), {}

    def build(builder: str, opset: int):
        if (builder, opset) not in cache:
            model, (x,) = getattr(torch_models, builder)()
            x = x * 2.0
            path = folder / f"{builder}_{opset}.onnx"
            torch.onnx.export(model, (x,), str(path), opset_version=opset, dynamo=False,
                              input_names=["x"], output_names=["y"])
            cache[builder, opset] = (onnx.load(str(path)), x.numpy())
        return cache[builder, opset]

    return build


# ---- the erf-free exact form ------------------------------------------------------------------


@pytest.mark.parametrize(("elem_type", "dtype", "erf_bound", "gelu_bound"),
                         [(TensorProto.FLOAT, np.float32, 1e-6, 1e-6), (TensorProto.DOUBLE, np.float64, 2e-7, 3e-7)])
def test_erf_free_form_is_within_1e_6_of_erf_on_minus_10_to_10(elem_type, dtype, erf_bound, gelu_bound):
    model = decompose_gelu_ops(gelu_model(["none"], elem_type), exact_form=ERF_FREE)
    assert_valid(model)
    assert {n.op_type for n in model.graph.node} == ERF_FREE_OPS
    [erf_node] = [n for n in model.graph.node if n.op_type == "Sub"]
    model.graph.output.append(helper.make_tensor_value_info(erf_node.output[0], elem_type, ["n"]))
    x = GRID.astype(dtype)
    y, erf = run(model, x, ["y", erf_node.output[0]])
    x64 = x.astype(np.float64)
    erf_error = float(np.max(np.abs(erf - np.vectorize(math.erf)(x64 / math.sqrt(2)))))
    gelu_error = float(np.max(np.abs(y - exact(x64))))
    assert erf_error < erf_bound and gelu_error < gelu_bound, (erf_error, gelu_error)


def test_erf_free_form_is_an_exact_site_and_no_relu_site():
    model = decompose_gelu_ops(gelu_model(["none"]), exact_form=ERF_FREE)
    [site] = find_gelu_sites(model)
    assert (site.op, site.claimed, site.input, site.output) == ("erf-chain", EXACT, "x", "y")
    assert "erf written out" in site.note
    assert set(site.nodes) == {n.name for n in model.graph.node}  # the unit's nodes are the site's
    assert flavours(model) == [("erf-chain", EXACT, EXACT, True)]
    assert find_relu_sites(model) == []
    [unit] = find_erf_units(_chain_graph(model.graph))
    assert unit.error < 2e-7
    assert [(e.site.op, e.measured, e.confident) for e in onnx_inventory(model)] == [("erf-chain", EXACT, True)]


def test_erf_free_form_in_float16_is_judged_by_structure():
    model = decompose_gelu_ops(gelu_model(["none"], TensorProto.FLOAT16), exact_form=ERF_FREE)
    assert_valid(model)
    [(op, claimed, _, confident)] = flavours(model)  # float16 probes cannot separate exact from tanh
    assert (op, claimed, confident) == ("erf-chain", EXACT, False)
    [entry] = onnx_inventory(model)
    assert (entry.flavour, entry.confident) == (EXACT, False)


def test_erf_free_form_with_wrong_constants_is_not_claimed_exact():
    model = decompose_gelu_ops(gelu_model(["none"]), exact_form=ERF_FREE)
    for init in model.graph.initializer:
        if init.name.endswith("/as_p"):
            init.CopyFrom(helper.make_tensor(init.name, TensorProto.FLOAT, [], [0.33]))
    assert [s.claimed for s in find_gelu_sites(model)] != [EXACT]


@pytest.mark.parametrize("builder", ["mlp_exact", "mlp_tanh"])
def test_decompose_with_erf_free_keeps_flavour_and_outputs(torch_export, builder):
    original, x = torch_export(builder, 20)
    flavour = EXACT if builder == "mlp_exact" else TANH
    decomposed = decompose_gelu_ops(original, exact_form=ERF_FREE)
    assert_valid(decomposed)
    ops = {n.op_type for n in decomposed.graph.node}
    assert not ops & {"Gelu", "Erf", "Sign", "Where", "Pow"}
    assert flavours(decomposed) == [("erf-chain" if flavour == EXACT else "tanh-chain", flavour, flavour, True)]
    [y0], [y1] = run(original, x), run(decomposed, x)
    np.testing.assert_allclose(y1, y0, atol=1e-6, rtol=0)
    lowered = version_converter.convert_version(decomposed, 17)
    assert_valid(lowered)
    np.testing.assert_allclose(run(lowered, x)[0], y0, atol=1e-6, rtol=0)


def test_replace_site_writes_the_erf_free_form(torch_export):
    original, x = torch_export("mlp_exact", 17)
    [site] = find_gelu_sites(original)
    rewritten = replace_site(original, site, EXACT, form=ERF_FREE)
    assert_valid(rewritten)
    assert "Erf" not in {n.op_type for n in rewritten.graph.node}
    assert flavours(rewritten) == [("erf-chain", EXACT, EXACT, True)]
    np.testing.assert_allclose(run(rewritten, x)[0], run(original, x)[0], atol=1e-6, rtol=0)


def test_erf_free_form_is_catalogued():
    form = FORMS[(EXACT, ERF_FREE)]
    assert form.min_opset == 13 and "no Erf" in form.writes
    coefficients = [CONSTANTS[f"as_a{k}"] for k in range(1, 6)]
    assert abs(sum(coefficients) - 1.0) < 2e-9 and CONSTANTS["as_p"] == 0.3275911


def test_decompose_refuses_an_unknown_exact_form():
    with pytest.raises(ValueError, match="exact_form"):
        decompose_gelu_ops(gelu_model(["none"]), exact_form="sign")


# ---- fusing chains into Gelu-20 ----------------------------------------------------------------


@pytest.mark.parametrize("exact_form", ["primitives", ERF_FREE])
def test_fuse_turns_chains_back_into_gelu(exact_form):
    chains = decompose_gelu_ops(gelu_model(["tanh", "none"]), exact_form=exact_form)
    fused = fuse_gelu_chains(chains)
    assert_valid(fused)
    assert [(n.op_type, helper.get_attribute_value(n.attribute[0])) for n in fused.graph.node] == [
        ("Gelu", b"tanh"), ("Gelu", b"none")]
    assert not fused.graph.initializer  # the chains' constants went with them
    assert flavours(fused) == [("Gelu", TANH, TANH, True), ("Gelu", EXACT, EXACT, True)]
    x = np.linspace(-8, 8, 4001, dtype=np.float32)
    np.testing.assert_allclose(run(fused, x)[0], run(chains, x)[0], atol=1e-6, rtol=0)


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """HF gelu_new (GPT-2), written out with torch.pow: stays a chain at every opset."""
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


def test_fuse_a_hand_written_pow_chain(tmp_path):
    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.down(gelu_new(self.up(x)))

    x = torch.randn(3, 8) * 2
    path = tmp_path / "gelu_new.onnx"
    torch.onnx.export(Mlp().eval(), (x,), str(path), opset_version=20, dynamo=False,
                      input_names=["x"], output_names=["y"])
    original = onnx.load(str(path))
    assert [s.op for s in find_gelu_sites(original)] == ["tanh-chain"]
    fused = fuse_gelu_chains(original)
    assert_valid(fused)
    assert {n.op_type for n in fused.graph.node} == {"Gemm", "Gelu"}
    assert flavours(fused) == [("Gelu", TANH, TANH, True)]
    np.testing.assert_allclose(run(fused, x.numpy())[0], run(original, x.numpy())[0], atol=1e-6, rtol=0)


def test_fuse_leaves_uncertain_chains_alone():
    typo = replace_site(gelu_model(["tanh"]), find_gelu_sites(gelu_model(["tanh"]))[0], TANH,
                        constants={"cubic": 0.0447})
    assert [s.claimed for s in find_gelu_sites(typo)] == [UNKNOWN]
    assert fuse_gelu_chains(typo).SerializeToString() == typo.SerializeToString()
    half = decompose_gelu_ops(gelu_model(["none"], TensorProto.FLOAT16))  # float16: not confident
    assert [n.op_type for n in fuse_gelu_chains(half).graph.node] == [n.op_type for n in half.graph.node]


def test_fuse_needs_opset_20(torch_export):
    original, _ = torch_export("mlp_exact", 17)
    with pytest.raises(ValueError, match="needs opset 20"):
        fuse_gelu_chains(original)
