"""Fingerprints: what each ONNX GELU site computes when run alone on the probes."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnxruntime.transformers.float16 import convert_float_to_float16

from verifiers.gelu import EXACT, QUICK, RELU, TANH, UNKNOWN
from verifiers.formats.onnx.gelu_sites import find_gelu_sites, find_relu_sites
from verifiers.formats.onnx.gelu_fingerprint import fingerprint_sites
from exporter import api
from fixtures.specs import torch_model
from verifiers.formats.onnx.gelu_fingerprint import probe_model


def measure(model):
    return fingerprint_sites(model, find_gelu_sites(model))


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize(
    ("kind", "flavour"),
    [("nn_gelu_none", EXACT), ("nn_gelu_tanh", TANH), ("f_gelu", EXACT), ("gelu_new", TANH), ("quick_gelu", QUICK)],
)
def test_measures_the_flavour_of_real_torch_exports(torch_onnx, kind, flavour, opset, dynamo):
    [fp] = measure(torch_onnx(kind, opset, dynamo))
    assert (fp.measured, fp.classification.confident, fp.dtype) == (flavour, True, "float32")
    assert fp.classification.residuals[flavour] < 1e-6


def test_measures_the_site_inside_a_model_not_the_model(torch_onnx):
    [fp] = measure(torch_onnx("nn_gelu_tanh", 17, dynamo=True, mlp=True))
    assert fp.measured == TANH


def test_optimizer_biasgelu_from_tanh_gelu_measures_exact(optimized):
    """Gelu(approximate='tanh') + bias -> BiasGelu: the kernel computes exact GELU."""
    [fp] = measure(optimized("nn_gelu_tanh", 20, 0, False))
    assert fp.site.op == "com.microsoft.BiasGelu"
    assert (fp.measured, fp.classification.confident) == (EXACT, True)


def test_optimizer_gelu_approximation_measures_tanh(optimized):
    [fp] = measure(optimized("nn_gelu_none", 17, 0, True))
    assert fp.site.op == "com.microsoft.FastGelu"
    assert (fp.measured, fp.classification.confident) == (TANH, True)


def test_bias_is_zeroed_so_the_activation_alone_is_measured(handmade):
    [fp] = measure(handmade.microsoft_op("FastGelu", bias=np.full(8, 0.5)))
    assert fp.measured == TANH


def test_tanh_with_0_0447_typo_measures_unknown(handmade):
    [fp] = measure(handmade.tanh_chain(0.0447))
    assert (fp.measured, fp.classification.confident) == (UNKNOWN, True)
    assert 8e-6 < fp.classification.residuals[TANH] < 9.5e-6


@pytest.mark.parametrize(("op_type", "flavour"), [("Gelu", EXACT), ("FastGelu", TANH), ("QuickGelu", QUICK)])
def test_microsoft_kernels_measure_their_flavour(handmade, op_type, flavour):
    [fp] = measure(handmade.microsoft_op(op_type))
    assert fp.measured == flavour


def test_tf2onnx_erfc_form_measures_exact(handmade):
    [fp] = measure(handmade.erfc_chain(negate_with_node=True))
    assert fp.measured == EXACT


def test_chained_sites_are_each_probed_from_their_own_input():
    graph = helper.make_graph(
        [helper.make_node("Gelu", ["x"], ["h"], name="first", approximate="tanh"),
         helper.make_node("Gelu", ["h"], ["y"], name="second")],
        "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    assert [fp.measured for fp in measure(model)] == [TANH, EXACT]


def test_relu_site_measures_relu(torch_onnx):
    model = torch_onnx("relu", 17, mlp=True)
    [fp] = fingerprint_sites(model, find_relu_sites(model))
    assert fp.measured == RELU


@pytest.mark.parametrize("kind", ["nn_gelu_none", "gelu_new"])
def test_float16_sites_cannot_separate_exact_from_tanh(torch_onnx, kind):
    model = convert_float_to_float16(torch_onnx(kind, 17), keep_io_types=False)
    [fp] = measure(model)
    assert fp.dtype == "float16"
    assert fp.measured in (EXACT, TANH) and not fp.classification.confident


def test_float16_quick_is_still_resolved(torch_onnx):
    model = convert_float_to_float16(torch_onnx("quick_gelu", 17), keep_io_types=False)
    [fp] = measure(model)
    assert (fp.dtype, fp.measured, fp.classification.confident) == ("float16", QUICK, True)


def test_probe_model_is_the_site_alone_on_a_column_of_probes(torch_onnx):
    model = torch_onnx("nn_gelu_none", 17, mlp=True)
    [site] = find_gelu_sites(model)
    probe = probe_model(model, site, TensorProto.FLOAT)
    assert [n.name for n in probe.graph.node] == list(site.nodes)
    assert [i.name for i in probe.graph.input] == [site.input]
    assert [d.dim_value for d in probe.graph.input[0].type.tensor_type.shape.dim] == [0, 1]
    assert all(np.asarray(i.dims).prod() <= 1 for i in probe.graph.initializer)


def test_a_tanh_written_with_exp_that_overflows_in_the_tail_is_a_change(handmade, tmp_path):
    # tanh(z) = (e^2z - 1) / (e^2z + 1): right on the core probes, inf/inf = NaN once e^2z overflows.
    c = float(np.sqrt(2 / np.pi))
    nodes = [helper.make_node("Mul", ["x", "x"], ["x2"]), helper.make_node("Mul", ["x2", "x"], ["x3"]),
             helper.make_node("Mul", ["x3", "cubic"], ["cx3"]), helper.make_node("Add", ["x", "cx3"], ["inner"]),
             helper.make_node("Mul", ["inner", "two_scale"], ["z2"]), helper.make_node("Exp", ["z2"], ["e"]),
             helper.make_node("Sub", ["e", "one"], ["num"]), helper.make_node("Add", ["e", "one"], ["den"]),
             helper.make_node("Div", ["num", "den"], ["t"]), helper.make_node("Add", ["t", "one"], ["p"]),
             helper.make_node("Mul", ["x", "p"], ["xp"]), helper.make_node("Mul", ["xp", "half"], ["y"])]
    model = handmade.graph_model(nodes, [handmade.scalar("cubic", 0.044715), handmade.scalar("two_scale", 2 * c),
                                         handmade.scalar("one", 1.0), handmade.scalar("half", 0.5)])
    [fp] = measure(model)
    assert fp.site.op == "elementwise" and fp.measured == UNKNOWN
    assert fp.classification.tail.startswith("NaN at x=")
    path = tmp_path / "overflowing.onnx"
    onnx.save(model, path)
    report = api.verify(path, source=torch_model("bare_gelu_tanh"))
    assert report.outputs[0].passed  # the random batches never reach |x| = 13
    assert report.exit_code == 3
    [entry] = report.gelu
    assert entry["status"] == "changed" and "NaN at x=" in entry["message"]


def _float64_contrib_gelu():
    """com.microsoft Gelu on float64, which onnxruntime has no kernel for (it expands to an Erf it
    cannot run in double)."""
    node = helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2, 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def test_a_probe_the_runtime_refuses_is_inconclusive_in_process_and_through_a_worker():
    from verifiers.runtimes import runtime_for
    from verifiers.runtimes.isolation import ProbesInWorker

    model = _float64_contrib_gelu()
    sites = find_gelu_sites(model)
    with ProbesInWorker(runtime_for("onnx")) as in_worker:
        for runner in (None, in_worker):
            [fp] = fingerprint_sites(model, sites, runner)
            assert (fp.measured, fp.classification.confident, fp.dtype) == (UNKNOWN, False, "float64")
            assert fp.classification.note.startswith("probe did not run: [ONNXRuntimeError]")
