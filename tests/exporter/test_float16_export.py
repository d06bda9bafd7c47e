"""--quantize fp16 on the ONNX routes: float16 compute, the ops whose measured values float16
cannot hold kept float32, verified in float16 arithmetic. The oracles are onnx's own reading of
the artifact (which ops compute in float16) and the fixtures' source text."""

import onnx
import pytest

from exporter import api
from fixtures.children import REPO
from fixtures.specs import MODELS
from verifiers.onnx_float16 import computes_in_float16

OVERFLOW = f"{MODELS / 'float16_models.py'}:overflow_mlp"
POW_LAYERNORM = f"{MODELS / 'float16_models.py'}:pow_layernorm"
MLP = f"{REPO / 'examples/mlp.py'}:build"


def _float16_ops(path) -> dict[str, str]:
    """{node: op type} of the ops that write float16 values, by onnx's shape inference."""
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    half = {v.name for v in (*model.graph.value_info, *model.graph.output)
            if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16}
    return {node.name: node.op_type for node in model.graph.node
            if node.op_type not in ("Cast", "Constant") and set(node.output) & half}


@pytest.mark.parametrize("source, overflowing", [(OVERFLOW, "Mul"), (POW_LAYERNORM, "Pow")])
def test_ops_whose_values_float16_cannot_hold_are_kept_float32_and_the_rest_computes_in_float16(
        source, overflowing, tmp_path):
    report = api.export(source, to="onnx", opset=17, quantize="fp16", out=tmp_path / "model.onnx")

    assert report.exit_code == 0, report.summary_lines()
    assert report.arithmetic["float16"].startswith("float16")  # verified in float16 arithmetic
    kept = report.quantization["kept_float32"]
    assert overflowing in {entry["op_type"] for entry in kept}
    assert all(entry["max_abs"] > 65504 / 4 and "measured max" in entry["why"] for entry in kept), kept
    half = _float16_ops(tmp_path / "model.onnx")
    assert not {entry["node"] for entry in kept} & set(half)  # kept: computing in float32
    assert len(half) == report.quantization["ops"] - len(kept) > len(kept)  # the rest in float16
    onnx.checker.check_model(str(tmp_path / "model.onnx"), full_check=True)  # its nodes in order


def test_a_model_inside_float16s_range_computes_wholly_in_float16_with_float32_inputs_and_outputs(tmp_path):
    report = api.export(MLP, to="onnx", opset=17, quantize="fp16", out=tmp_path / "mlp.onnx")

    assert report.exit_code == 0, report.summary_lines()
    assert report.quantization["kept_float32"] == [] and report.quantization["io"] == "float"
    graph = onnx.load(str(tmp_path / "mlp.onnx")).graph
    assert {v.type.tensor_type.elem_type for v in (*graph.input, *graph.output)} == {onnx.TensorProto.FLOAT}
    assert set(_float16_ops(tmp_path / "mlp.onnx").values()) >= {"Gemm", "Erf", "Mul"}
    assert report.quantization["measured_on"]["random"] is True


def test_keep_fp32_keeps_an_op_type_or_a_modules_ops(tmp_path):
    report = api.export(MLP, to="onnx", opset=17, quantize="fp16", keep_fp32=["Erf", "2"], out=tmp_path / "mlp.onnx")

    assert report.exit_code == 0, report.summary_lines()
    kept = {entry["node"]: entry for entry in report.quantization["kept_float32"]}
    assert {e["op_type"] for e in kept.values() if e["why"] == "--keep-fp32 Erf"} == {"Erf"}
    assert [e["op_type"] for e in kept.values() if e["why"] == "--keep-fp32 2"] == ["Gemm"]  # the second Linear
    # A GELU computes in one precision: the rest of each chain an Erf of was kept with it.
    assert {e["op_type"] for e in kept.values() if e["why"].startswith("part of the erf-chain")} == {"Div", "Add", "Mul"}
    assert not set(kept) & set(_float16_ops(tmp_path / "mlp.onnx"))
    assert report.gelu and all(site["status"] == "kept" for site in report.gelu), report.gelu


def test_io_float16_gives_float16_inputs_and_outputs_noted_not_failed(tmp_path):
    report = api.export(MLP, to="onnx", opset=17, quantize="fp16", io="float16", out=tmp_path / "mlp.onnx")

    assert report.exit_code == 0, report.summary_lines()
    graph = onnx.load(str(tmp_path / "mlp.onnx")).graph
    assert {v.type.tensor_type.elem_type for v in (*graph.input, *graph.output)} == {onnx.TensorProto.FLOAT16}
    assert "output output: the artifact's is float16, the source's float32 (--io float16)" in report.notes


@pytest.mark.parametrize("options, message", [
    (dict(to="onnx", opset=17, keep_fp32=["Erf"]), "--keep-fp32 applies to float16 exports only: add --quantize fp16"),
    (dict(to="onnx", opset=17, io="float16", quantize="int8"), "--io float16 sets the input/output types of float16 "
                                                               "exports only: add --quantize fp16"),
    (dict(to="tflite", quantize="fp16", keep_fp32=["Erf"]), "--keep-fp32 applies to ONNX float16 exports"),
    (dict(to="onnx", opset=17, quantize="fp16", keep_fp32=["Softmax"]), "--keep-fp32 Softmax: no op of that type or "
                                                                          "in that module"),
])
def test_float16_options_that_do_not_apply_are_exit_2(options, message, tmp_path):
    report = api.export(MLP, out=tmp_path / "model.out", **options)

    assert report.exit_code == 2
    assert report.failures[0].message.startswith(message), report.failures[0].message


@pytest.mark.parametrize("name", [
    "bert-text-classification",
    pytest.param("gpt2-causal-lm", marks=pytest.mark.slow),  # with its cache, and generate
    pytest.param("vit-image-classification", marks=pytest.mark.slow),
])
def test_transformers_folders_export_to_float16_and_pass_in_float16_arithmetic(name, tmp_path):
    from fixtures.models.hf_folders import save_folder

    folder = save_folder(name, tmp_path / name)

    report = api.export(str(folder), to="onnx", opset=17, quantize="fp16", out=tmp_path / "out" / "model.onnx")

    assert report.exit_code == 0, report.summary_lines()
    assert computes_in_float16(onnx.load(str(tmp_path / "out" / "model.onnx")))
    assert report.variant_outputs["float16"] and all(o.passed for o in report.variant_outputs["float16"])
    if report.generation:  # a decoder with past also generates in float16 arithmetic, on its own cache
        assert report.generation["variants"] == ["default", "float16"]


@pytest.mark.slow  # a keras.applications model through tf2onnx
def test_a_keras_applications_model_exports_to_float16(tmp_path):
    report = api.export(f"{MODELS / 'int8_models.py'}:keras_mobilenet_v2", to="onnx", opset=17, quantize="fp16",
                        out=tmp_path / "mnv2.onnx")

    assert report.exit_code == 0, report.summary_lines()
    assert report.variant_outputs["float16"] and all(o.passed for o in report.variant_outputs["float16"])
