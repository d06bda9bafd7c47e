"""float16 artifacts verified in float16 arithmetic, not only in the float32 onnxruntime's x86 CPU
kernels compute them in. The artifacts are onnxruntime's own float16 converter's
(`convert_float_to_float16(model, keep_io_types=True)`, the recipe users run); the oracles are
PyTorch's own float16 arithmetic on CPU and the fixture's source text."""

import inspect

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from exporter import api
from fixtures.models import float16_models
from fixtures.specs import MODELS
from verifiers.onnx_float16 import computes_in_float16, emulated

OVERFLOW = f"{MODELS / 'float16_models.py'}:overflow_mlp"
POW_LAYERNORM = f"{MODELS / 'float16_models.py'}:pow_layernorm"
MLP = f"{MODELS.parent.parent / 'examples' / 'mlp.py'}:build"


def _converted(source: str, folder) -> tuple:
    """The source exported to ONNX by exportgate, then converted to float16 by onnxruntime's tool."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    name = source.rsplit(":", 1)[1]
    assert api.export(source, to="onnx", opset=17, out=folder / f"{name}.onnx").exit_code == 0
    model = convert_float_to_float16(onnx.load(str(folder / f"{name}.onnx")), keep_io_types=True)
    onnx.save(model, str(folder / f"{name}-float16.onnx"))
    return folder / f"{name}-float16.onnx", model


def _line_of(function, text: str) -> int:
    """The line of the fixture's file that holds `text`, inside `function`."""
    lines, start = inspect.getsourcelines(function)
    return start + next(k for k, line in enumerate(lines) if text in line)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("float16")
    return {name: _converted(source, folder) for name, source in
            (("overflow", OVERFLOW), ("pow_layernorm", POW_LAYERNORM), ("mlp", MLP))}


def test_the_emulation_overflows_exactly_where_pytorch_float16_does(converted):
    _, model = converted["overflow"]
    rewritten = emulated(model)
    rewritten.graph.output.extend([onnx.helper.make_tensor_value_info(v.name, onnx.TensorProto.FLOAT, None)
                                   for v in onnx.shape_inference.infer_shapes(model).graph.value_info
                                   if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(rewritten.SerializeToString(), options, providers=["CPUExecutionProvider"])
    source, (x,) = float16_models.overflow_mlp()
    names = [o.name for o in session.get_outputs()]
    values = dict(zip(names, session.run(None, {session.get_inputs()[0].name: x.numpy()})))
    with torch.no_grad():  # PyTorch's own float16 arithmetic on CPU
        half = source.half()
        h = half.fc1(x.half()) * 300.0
        squared = (h * h).float().numpy()
        output = half(x.half()).float().numpy()
    assert np.isinf(squared).sum() > 50  # the overflow is there to find
    finite = ~np.isinf(squared)
    # h * h as the emulation holds it: Inf at the same places, elsewhere the same float16 values (to
    # the rounding of PyTorch's float16 matmul, which rounds its product and its bias apart)
    assert any(v.shape == squared.shape and np.array_equal(np.isinf(v), ~finite)
               and np.allclose(v[finite], squared[finite], rtol=4e-3) for v in values.values())
    assert np.array_equal(np.isfinite(values[names[0]]), np.isfinite(output))
    # onnxruntime's own run of the same file computes in float32: nothing overflows there.
    plain = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert np.isfinite(plain.run(None, {plain.get_inputs()[0].name: x.numpy()})[0]).all()


@pytest.mark.parametrize("name, function, text, op_type", [
    ("overflow", float16_models.overflow_mlp, "squared = h * h", "Mul"),
    ("pow_layernorm", float16_models.pow_layernorm, "variance = centred.pow(2)", "Pow"),
])
def test_a_float16_artifact_that_overflows_fails_naming_the_op_its_module_and_line(converted, name, function,
                                                                                   text, op_type):
    path, _ = converted[name]
    source = OVERFLOW if name == "overflow" else POW_LAYERNORM

    report = api.verify(path, source=source)

    assert report.exit_code == 1, report.summary_lines()
    assert all(f.data.get("variant") == "float16" for f in report.failures), [f.message for f in report.failures]
    overflow = report.divergence["overflow"]
    assert overflow["op_type"] == op_type and overflow["module"] == ""
    assert overflow["source"] == f"float16_models.py:{_line_of(function, text)}"
    assert overflow["source_max_abs"] > 65504
    assert report.divergence["message"].startswith(f"first overflow in float16: {op_type} ")
    # onnx.checker refuses the converter's order; onnxruntime runs it, and so is it verified.
    assert any(note.startswith("onnx.checker refuses the file, and onnxruntime loads it: Nodes in a graph must be "
                               "topologically sorted") and note.endswith("is not output of any previous nodes.")
               for note in report.notes), report.notes


def test_a_float16_artifact_that_stays_in_range_passes_in_both_arithmetics(converted):
    path, _ = converted["mlp"]

    report = api.verify(path, source=MLP)

    assert report.exit_code == 0, report.summary_lines()
    assert set(report.arithmetic) == {"default", "float16"}
    assert report.arithmetic["default"].startswith("float32") and report.arithmetic["float16"].startswith("float16")
    assert {o.name for o in report.variant_outputs["float16"]} == {o.name for o in report.outputs}
    assert report.outputs[0].atol == 1e-2  # float16's tolerances, not float32's


def test_a_float32_artifact_runs_one_way(converted, tmp_path):
    exported = tmp_path / "mlp.onnx"
    assert api.export(MLP, to="onnx", opset=17, out=exported).exit_code == 0

    assert not computes_in_float16(onnx.load(str(exported)))
    report = api.verify(exported, source=MLP)
    assert report.exit_code == 0 and not report.arithmetic and not report.variant_outputs


def test_a_float16_graph_the_emulation_cannot_rewrite_is_never_green(tmp_path):
    """A float16 If: its branches are subgraphs, which the emulation does not rewrite."""
    from onnx import TensorProto, helper

    branch = lambda op: helper.make_graph(  # noqa: E731
        [helper.make_node(op, ["xh", "xh"], [f"{op}_out"])], op, [],
        [helper.make_tensor_value_info(f"{op}_out", TensorProto.FLOAT16, [8, 16])])
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16),
         helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
         helper.make_node("Greater", ["total", "zero"], ["positive"]),
         helper.make_node("If", ["positive"], ["yh"], then_branch=branch("Add"), else_branch=branch("Add")),
         helper.make_node("Cast", ["yh"], ["y"], to=TensorProto.FLOAT)],
        "if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])],
        [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "if.onnx"))
    (tmp_path / "double.py").write_text("import torch\n\n\ndef build():\n    class Double(torch.nn.Module):\n"
                                        "        def forward(self, x):\n            return x + x\n\n"
                                        "    return Double(), (torch.randn(8, 16),)\n")

    report = api.verify(tmp_path / "if.onnx", source=f"{tmp_path / 'double.py'}:build")

    assert report.exit_code == 4, report.summary_lines()
    [finding] = [f for f in report.failures if f.kind == "runtime"]
    assert "the emulation cannot rewrite it: If" in finding.message and "holds a subgraph" in finding.message
    assert finding.message.endswith("verify it where float16 runs")


@pytest.mark.parametrize("name", [
    "bert-text-classification",
    pytest.param("gpt2-causal-lm", marks=pytest.mark.slow),  # with its cache, and generate
    pytest.param("vit-image-classification", marks=pytest.mark.slow),
])
def test_transformers_folders_converted_to_float16_pass_in_float16_arithmetic(name, tmp_path):
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from fixtures.models.hf_folders import save_folder

    folder = save_folder(name, tmp_path / name)
    assert api.export(str(folder), to="onnx", opset=17, out=tmp_path / "out" / "model.onnx").exit_code == 0
    model = convert_float_to_float16(onnx.load(str(tmp_path / "out" / "model.onnx")), keep_io_types=True)
    onnx.save(model, str(tmp_path / "out" / "float16.onnx"))

    report = api.verify(tmp_path / "out" / "float16.onnx", source=str(folder))

    assert report.exit_code == 0, report.summary_lines()
    assert report.arithmetic["float16"].startswith("float16")
    assert report.variant_outputs["float16"] and all(o.passed for o in report.variant_outputs["float16"])


def test_a_constant_the_converter_clamped_to_65504_is_named(tmp_path):
    """The constant 1e5 is beyond float16: onnxruntime's converter clamps it to 65504, and every
    output is a third off; the first diverging op is the one that reads it, and the clamp is said."""
    source = f"{MODELS / 'float16_models.py'}:large_constant"
    path, _ = _converted(source, tmp_path)

    report = api.verify(path, source=source)

    assert report.exit_code == 1, report.summary_lines()
    assert report.divergence["first"]["op_type"] == "Mul"
    assert report.divergence["first"]["source"] == (
        f"float16_models.py:{_line_of(float16_models.large_constant, 'scaled = torch.tanh')}")
    [clamped] = report.divergence["clamped"]
    constants = {node.output[0]: onnx.numpy_helper.to_array(node.attribute[0].t)
                 for node in onnx.load(str(path)).graph.node if node.op_type == "Constant"}
    assert float(constants[clamped]) == 65504.0
    assert "a constant clamped by a float16 converter" in report.divergence["message"]


def test_float16_inputs_and_outputs_where_the_source_has_float32_fail_naming_them(tmp_path):
    from onnxruntime.transformers.float16 import convert_float_to_float16

    assert api.export(MLP, to="onnx", opset=17, out=tmp_path / "mlp.onnx").exit_code == 0
    onnx.save(convert_float_to_float16(onnx.load(str(tmp_path / "mlp.onnx")), keep_io_types=False),
              str(tmp_path / "all-float16.onnx"))

    report = api.verify(tmp_path / "all-float16.onnx", source=MLP)

    assert report.exit_code == 1, report.summary_lines()
    typed = {(f.data.get("input"), f.data.get("output")) for f in report.failures if f.data.get("cause") == "dtype"}
    assert typed == {("input", None), (None, "output")}
    assert all(f.passed for f in report.outputs)  # its values are right: only the types changed


def test_a_float16_artifact_whose_gelu_became_tanh_is_named_by_structure(tmp_path):
    """float16 cannot tell exact from tanh by value (4.7e-4 apart, float16's spacing near 2.7 is
    2e-3): the outputs pass float16's tolerances, and the guard names the change by structure."""
    exact, tanh = (f"{MODELS / 'torch_models.py'}:{name}" for name in ("mlp_exact", "mlp_tanh"))
    path, _ = _converted(tanh, tmp_path)

    report = api.verify(path, source=exact)

    assert report.exit_code == 3, report.summary_lines()
    assert all(o.passed for o in report.outputs)  # within float16's tolerances
    [changed] = [f for f in report.failures if f.kind == "gelu"]
    assert "is exact" in changed.message and "tanh" in changed.message
