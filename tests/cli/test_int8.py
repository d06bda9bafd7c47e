"""Full-integer (int8) artifacts end to end: judged by SQNR and top-1 rather than atol, a ruined
scale named as the first layer that collapses, integer devices that refuse float models, and
artifacts other tools quantized (TFLiteConverter, onnxruntime's quantize_static) judged the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from exporter import api
from fixtures.make_broken_int8 import full_integer_tflite, op_tensor, scale_onnx_initializer, scale_tflite_tensor

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "fixtures" / "models" / "int8_models.py"
EXAMPLE = REPO / "examples" / "mlp.py"
SCALE = 2.0  # exportgate's random float batches are standard normal times 2 (exporter.sources)


def _feeds(name: str, shape: tuple[int, ...], count: int = 8, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{name: (SCALE * rng.standard_normal(shape)).astype(np.float32)} for _ in range(count)]


def _tflite_int8(io: str) -> bytes:
    """keras_mlp quantized by TFLiteConverter directly (not by exportgate)."""
    from fixtures.models.int8_models import keras_mlp

    return full_integer_tflite(keras_mlp(), [feed["x"] for feed in _feeds("x", (2, 16))], io)


def _qdq_cnn(folder: Path) -> Path:
    """torch_cnn exported by torch.onnx and quantized by onnxruntime's quantize_static directly."""
    import torch
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from fixtures.models.int8_models import torch_cnn

    model, (example,) = torch_cnn()
    float_path, qdq_path = folder / "cnn_float.onnx", folder / "cnn_int8.onnx"
    torch.onnx.export(model, (example,), str(float_path), input_names=["input"], output_names=["output"],
                      opset_version=17, dynamo=False)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter(_feeds("input", (2, 3, 16, 16)))

        def get_next(self):
            return next(self.feeds, None)

    quantize_static(str(float_path), str(qdq_path), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    weight_type=QuantType.QInt8, activation_type=QuantType.QInt8)
    return qdq_path


# ---- artifacts other tools quantized ---------------------------------------------------------------


@pytest.mark.parametrize("io", ["float", "int8"])
def test_an_int8_tflite_from_the_converter_is_judged_by_sqnr(tmp_path, io):
    artifact = tmp_path / f"mlp_{io}.tflite"
    artifact.write_bytes(_tflite_int8(io))
    report = api.verify(artifact, source=f"{MODELS}:keras_mlp")
    assert report.exit_code == 0, report.summary_lines()
    assert report.quantization["mode"] == "int8" and report.quantization["float_ops"] == []
    assert report.quantization["io"] == ("float" if io == "float" else "int8")
    (output,) = report.outputs
    assert output.sqnr_db > 25 and output.cosine > 0.99 and output.top1_agreement >= 0.95
    assert output.min_sqnr_db == 20 and output.min_top1 == 0.95
    assert "layers" not in report.quantization  # a clear pass is not diagnosed
    assert report.quantization["spec_violations"] == []


def test_a_ruined_tflite_scale_fails_and_is_named_first(tmp_path):
    content = _tflite_int8("int8")
    ruined = op_tensor(content, "FULLY_CONNECTED", "weight")  # the first layer's int8 weights
    artifact = tmp_path / "mlp_ruined.tflite"
    artifact.write_bytes(scale_tflite_tensor(content, ruined, 20.0))
    report = api.verify(artifact, source=f"{MODELS}:keras_mlp")
    assert report.exit_code == 1
    assert report.quantization["first_collapse"]["tensor"] == ruined
    numeric = [f for f in report.failures if f.kind == "numeric"]
    assert numeric and all(ruined in f.message and "SQNR" in f.message for f in numeric)
    assert report.quantization["spec_violations"] == []  # Dense biases of zeros: the converter wrote none
    layers = report.quantization["layers"]
    assert [layer["sqnr_db"] for layer in layers if layer["sqnr_db"] is not None] == sorted(
        layer["sqnr_db"] for layer in layers if layer["sqnr_db"] is not None)  # worst first


def test_the_layer_diagnosis_runs_the_artifact_in_the_runtime_worker(cli, tmp_path):
    """The exportgate process cannot import the TFLite interpreter here: only its runtime worker,
    a fresh interpreter, runs the two models whose layers are compared."""
    content = _tflite_int8("int8")
    ruined = op_tensor(content, "FULLY_CONNECTED", "weight")
    (tmp_path / "ruined.tflite").write_bytes(scale_tflite_tensor(content, ruined, 20.0))
    result = cli("verify", "ruined.tflite", "--source", f"{MODELS}:keras_mlp", "--report", "r.json", "--quiet",
                 prelude="import sys; sys.modules['ai_edge_litert.interpreter'] = None")
    assert result.returncode == 1, result.stderr
    assert json.loads((tmp_path / "r.json").read_text())["quantization"]["first_collapse"]["tensor"] == ruined


def test_a_qdq_model_from_quantize_static_is_judged_by_sqnr_and_a_ruined_weight_scale_named(tmp_path):
    import onnx

    qdq = _qdq_cnn(tmp_path)
    report = api.verify(qdq, source=f"{MODELS}:torch_cnn")
    assert report.exit_code == 0, report.summary_lines()
    # (exit 0: SQNR >= 20 dB; no more is asked of onnxruntime's int8 kernels, whose accuracy
    # depends on the CPU: U8S8 products saturate without VNNI)
    assert report.quantization["mode"] == "int8" and report.quantization["float_ops"] == []
    assert "spec_violations" not in report.quantization  # only TFLite's int8 spec is checked

    model = onnx.load(str(qdq))
    dequantizes = {n.output[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
    second_conv = [n for n in model.graph.node if n.op_type == "Conv"][1]
    weights = dequantizes[second_conv.input[1]]  # DequantizeLinear(int8 weights, scale, zero point)
    onnx.save(scale_onnx_initializer(model, weights.input[1], 20.0), str(tmp_path / "cnn_ruined.onnx"))
    report = api.verify(tmp_path / "cnn_ruined.onnx", source=f"{MODELS}:torch_cnn")
    assert report.exit_code == 1, report.summary_lines()
    collapse = report.quantization["first_collapse"]
    assert collapse["tensor"] in (weights.output[0], weights.input[0].removesuffix("_quantized")), collapse


# ---- exports for integer devices ------------------------------------------------------------------


def test_a_float_model_is_refused_by_integer_devices(cli, tmp_path):
    """The float32 MLP exported for the Edge TPU is exit 4 naming its first float op, the
    requirement and the options that meet it (test_an_int8_export_with_int8_io_passes_the_edge_tpu
    takes them); the Hexagon delegate refuses the same artifact and names the export for it."""
    result = cli("export", f"{EXAMPLE}:build", "--to", "tflite", "--target", "edgetpu-16.0",
                 "--out", "mlp.tflite", "--report", "report.json")
    assert result.returncode == 4, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    (precision,) = [c for c in report["target_checks"] if c["kind"] == "precision"]
    assert "FULLY_CONNECTED" in precision["message"] and "integer_only: true" in precision["message"]
    assert precision["message"].endswith("; add --quantize int8 --io int8")
    assert not (tmp_path / "mlp.tflite").exists()
    check = cli("check", report["rejected_artifact"], "--target", "tflite-2.9-hexagon")
    assert check.returncode == 4 and "only full-integer models" in check.stdout + check.stderr
    assert ("exportgate export MODEL --to tflite --target tflite-2.9-hexagon --quantize int8 --io int8 writes one "
            "it takes") in check.stdout + check.stderr


def test_an_int8_export_with_int8_io_passes_the_edge_tpu(tmp_path):
    out = tmp_path / "mlp.tflite"
    report = api.export(f"{MODELS}:keras_mlp", to="tflite", out=out, quantize="int8", io="int8",
                        target="edgetpu-16.0")
    assert report.exit_code == 0, report.summary_lines()
    assert report.target_checks == []
    q = report.quantization
    assert (q["mode"], q["io"], q["float_ops"]) == ("int8", "int8", [])
    assert q["calibration"]["random"] and "TFLiteConverter" in q["method"]
    assert any("calibration" in line and "random" in line for line in report.summary_lines())
    from verifiers.formats import open_artifact

    precision = open_artifact(out).precision()
    assert [io.dtype for io in (*precision.inputs, *precision.outputs)] == ["int8", "int8"]
    assert report.outputs[0].sqnr_db > 25


def test_a_dynamic_axis_on_a_static_shape_target_is_exit_4(tmp_path):
    report = api.export(f"{MODELS}:keras_mlp", to="tflite", out=tmp_path / "mlp.tflite", quantize="int8",
                        dynamic=["x:0"], target="edgetpu-16.0")
    assert report.exit_code == 4
    shapes = [c["message"] for c in report.target_checks if c["kind"] == "shape"]
    assert shapes and "axis 0" in shapes[0]


def test_a_torch_cnn_to_onnx_int8_is_a_qdq_model_for_qnn(tmp_path):
    out = tmp_path / "cnn.onnx"
    report = api.export(f"{MODELS}:torch_cnn", to="onnx", opset=17, out=out, quantize="int8",
                        target="ort-1.18-qnn-htp")
    assert report.exit_code == 0, report.summary_lines()
    assert report.quantization["mode"] == "int8" and report.quantization["float_ops"] == []
    assert report.outputs[0].top1_agreement == 1.0  # and SQNR >= 20 dB (exit 0), whatever the CPU's int8 kernels
    assert not list(tmp_path.glob("*float*"))  # the float twin is never left beside the artifact


def test_calibration_data_is_used_and_checked(cli, tmp_path):
    rng = np.random.default_rng(3)
    np.savez(tmp_path / "calibration.npz", x=SCALE * rng.standard_normal((16, 16)))  # float64, as numpy makes it
    report = api.export(f"{MODELS}:keras_mlp", to="tflite", out=tmp_path / "mlp.tflite", quantize="int8",
                        calibration=str(tmp_path / "calibration.npz"))
    assert report.exit_code == 0, report.summary_lines()
    assert report.quantization["calibration"] == {"source": str(tmp_path / "calibration.npz"), "batches": 8,
                                                  "random": False, "cast": {"x": "float64 -> float32"}}
    assert any(note.startswith("--calibration") and "x float64 -> float32" in note for note in report.notes)
    np.savez(tmp_path / "ids.npz", x=rng.integers(0, 9, (16, 16)))
    result = cli("export", f"{MODELS}:keras_mlp", "--to", "tflite", "--quantize", "int8", "--calibration",
                 str(tmp_path / "ids.npz"), "--out", str(tmp_path / "bad" / "mlp.tflite"))
    assert result.returncode == 2 and "x" in result.stderr and "int64" in result.stderr, result.stderr
    assert not (tmp_path / "bad").exists()
    result = cli("export", f"{MODELS}:keras_mlp", "--to", "tflite", "--io", "int8",
                 "--out", str(tmp_path / "bad" / "mlp.tflite"))
    assert result.returncode == 2 and "--quantize int8" in result.stderr


def test_int8_gelus_are_reported_as_int8_cannot_resolve_them(tmp_path):
    """The example MLP's exact GELUs in int8 TFLite are 256-entry tables whose exact and tanh forms
    agree within one output step: neither kept nor changed."""
    report = api.export(f"{EXAMPLE}:build", to="tflite", out=tmp_path / "mlp.tflite", quantize="int8")
    assert report.exit_code == 0, report.summary_lines()
    assert report.quantization["float_ops"] == []
    statuses = {g["status"] for g in report.gelu}
    assert statuses == {"indistinguishable"}, report.gelu
    assert all(g["resolution"] > 4.7e-4 for g in report.gelu)
    assert any("int8 cannot resolve" in line for line in report.summary_lines())


@pytest.mark.slow
def test_mobilenet_v2_int8_passes_the_edge_tpu(tmp_path):
    report = api.export(f"{MODELS}:keras_mobilenet_v2", to="tflite", out=tmp_path / "mnv2.tflite", quantize="int8",
                        inputs=["image:1x96x96x3:float32"], target="edgetpu-16.0")
    assert report.exit_code == 0, report.summary_lines()
    assert report.quantization["float_ops"] == [] and report.target_checks == []
    assert report.outputs[0].sqnr_db > 25 and report.outputs[0].top1_agreement == 1.0


@pytest.mark.slow
def test_a_torch_cnn_to_tflite_int8_passes_the_edge_tpu(tmp_path):
    report = api.export(f"{MODELS}:torch_cnn_one_image", to="tflite", out=tmp_path / "cnn.tflite", quantize="int8",
                        target="edgetpu-16.0")
    assert report.exit_code == 0, report.summary_lines()
    assert report.quantization["float_ops"] == [] and report.target_checks == []
    assert report.outputs[0].sqnr_db > 25


def test_a_plain_transformers_folder_to_onnx_int8_passes(tmp_path, monkeypatch):
    """A BertModel folder (save_pretrained): onnxruntime's symbolic shape inference stops on the
    TorchScript export ("Incomplete symbolic shape inference"), so the float model is prepared
    without it, as onnxruntime documents, and what it saves on giving up stays out of the working
    directory; the QDQ artifact's GELU sites are read with its weights left in the file."""
    from fixtures.models.hf_folders import PLAIN_BERT, save_folder

    folder = save_folder(PLAIN_BERT, tmp_path / "bert")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    report = api.export(str(folder), to="onnx", opset=17, out=tmp_path / "out" / "bert.onnx", quantize="int8")
    assert report.exit_code == 0, report.summary_lines()
    assert report.quantization["preparation"] == "quant_pre_process(skip_symbolic_shape=True)"
    assert all(o.sqnr_db >= 20 for o in report.outputs)
    assert [g["status"] for g in report.gelu] == ["kept", "kept"]
    assert list((tmp_path / "cwd").iterdir()) == []


@pytest.mark.slow
def test_bert_to_onnx_int8_keeps_integer_ids(tmp_path):
    out = tmp_path / "bert.onnx"
    report = api.export(f"{MODELS}:bert_tiny", to="onnx", opset=17, out=out, quantize="int8")
    assert report.exit_code == 0, report.summary_lines()
    assert report.quantization["float_ops"] == []
    from verifiers.formats import open_artifact

    assert {io.name: io.dtype for io in open_artifact(out).precision().inputs} == {
        "input_ids": "int64", "attention_mask": "int64"}
    assert min(o.sqnr_db for o in report.outputs) > 20


def test_the_config_takes_int8_options_and_hashes_the_calibration_data(tmp_path):
    from exporter.config import load_config
    from exporter.jobs import export_arguments
    from verifiers.errors import BadInput

    (tmp_path / "data").mkdir()
    np.savez(tmp_path / "data" / "batch0.npz", x=np.zeros((2, 16), np.float32))
    config = tmp_path / "exportgate.toml"
    config.write_text(f"""
[models.mlp]
spec = "{MODELS}:keras_mlp"

[artifacts.int8]
to = "tflite"
quantize = "int8"
io = "int8"
calibration = "data"
min_sqnr = 25
min_top1 = 0.9
""")
    (job,) = load_config(config).jobs
    assert job.options["calibration"] == str(tmp_path / "data") and tmp_path / "data" in job.files
    args = export_arguments(job, tmp_path / "out.tflite", tmp_path / "report.json", {})
    for flag, value in (("--calibration", str(tmp_path / "data")), ("--io", "int8"), ("--min-sqnr", "25.0"),
                        ("--min-top1", "0.9")):
        assert args[args.index(flag) + 1] == value
    config.write_text(config.read_text().replace('quantize = "int8"\n', ""))
    with pytest.raises(BadInput, match="job mlp/int8: io: --io int8 .*--quantize int8"):
        load_config(config)
