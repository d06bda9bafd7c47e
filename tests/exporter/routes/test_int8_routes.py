"""--quantize int8 on every route: full-integer artifacts calibrated on seeded feeds, checked in
their structure (int8 activations, nothing float between input and output; QDQ for ONNX) and
against the source on held-out inputs by SQNR."""

import numpy as np
import pytest

from exporter.frameworks import FRAMEWORKS
from exporter.routes import ExportRequest, route_for
from exporter.sources import InputSpec, Source, make_batches
from verifiers.errors import BadInput, Incompatible
from verifiers.formats import FORMATS

MIN_SQNR_DB = 20.0  # measured: 29 to 42 dB on these models


def keras_mlp():
    from exporter.frameworks.keras_framework import prepare_keras_environment

    prepare_keras_environment()
    import keras

    keras.utils.set_random_seed(0)
    features = keras.Input((16,), batch_size=4, name="features")
    hidden = keras.layers.Dense(32, activation="relu")(features)
    model = keras.Model(features, keras.layers.Dense(4, name="logits")(hidden))
    return FRAMEWORKS["keras"].make_source("keras_mlp", model, None, [], list)


def torch_cnn():
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).eval()
    return Source("torch_cnn", FRAMEWORKS["torch"], model, [InputSpec("x", (1, 3, 16, 16), "float32")])


SOURCES = {"keras": keras_mlp, "torch": torch_cnn}


def export(framework, fmt, folder, io="float", **request):
    """(source, held-out feeds, artifact path, result) of an int8 export calibrated on 8 seeded batches."""
    source = SOURCES[framework]()
    calibration = make_batches(source, 1, 8)
    dest = folder / f"{framework}_{io}.{fmt}"
    result = route_for(framework, fmt, quantize="int8").export(
        source, ExportRequest(fmt, output_names=source.run(calibration[0])[0], sample_inputs=calibration[0],
                              quantize="int8", io=io, calibration=calibration, **request),
        dest, progress=lambda message: None)
    return source, make_batches(source, 2, 4), dest, result


def sqnr_db(reference: list[np.ndarray], artifact: list[np.ndarray]) -> float:
    ref, art = np.concatenate([r.ravel() for r in reference]), np.concatenate([a.ravel() for a in artifact])
    return float(20 * np.log10(np.linalg.norm(ref) / np.linalg.norm(ref - art)))


def tflite_sqnr(path, source, feeds) -> float:
    """The artifact against the source, feeding and reading quantized I/O through its scale and zero point."""
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(path)).get_signature_runner()
    inputs, outputs = runner.get_input_details(), runner.get_output_details()
    reference, produced = [], []
    for feed in feeds:
        given = {}
        for name, detail in inputs.items():
            scale, zero = detail["quantization"]
            value = feed[name]
            if detail["dtype"] != np.float32 and scale:  # not token ids
                info = np.iinfo(detail["dtype"])
                value = np.clip(np.round(value / scale + zero), info.min, info.max)
            given[name] = value.astype(detail["dtype"])
        result = runner(**given)
        names, _, arrays = source.run(feed)
        for name, array in zip(names, arrays):
            scale, zero = outputs[name]["quantization"]
            out = result[name].astype(np.float32)
            produced.append((out - zero) * scale if outputs[name]["dtype"] != np.float32 else out)
            reference.append(array)
    return sqnr_db(reference, produced)


@pytest.mark.parametrize("framework, io", [("keras", "float"), ("keras", "int8"), ("torch", "float"),
                                           ("torch", "uint8")])
def test_tflite_int8_computes_in_int8_between_input_and_output(tmp_path, framework, io):
    source, feeds, path, result = export(framework, "tflite", tmp_path, io)

    precision = FORMATS["tflite"].open(path).precision()
    assert precision.mode == "int8" and precision.float_ops == ()
    assert {t.dtype for t in (*precision.inputs, *precision.outputs)} == {"float32" if io == "float" else io}
    from verifiers.tflite_model import load_tflite

    model = load_tflite(path)
    graph = model.subgraphs[0]
    compute = [op for op in graph.operators if model.opcode(op).name not in ("QUANTIZE", "DEQUANTIZE")]
    activations = {graph.tensors[op.outputs[0]].dtype for op in compute}
    assert activations == {"int8"}, activations
    assert result.quantization["mode"] == "int8" and result.quantization["io"] == io
    assert result.quantization["float_fallback"] is False
    assert ("PT2E" if framework == "torch" else "TFLiteConverter") in result.quantization["method"]
    assert tflite_sqnr(path, source, feeds) > MIN_SQNR_DB


def test_keras_op_without_int8_kernel_is_incompatible_unless_allowed(tmp_path):
    import keras

    source = keras_mlp()
    features = keras.Input((16,), batch_size=4, name="features")
    waves = keras.layers.Lambda(lambda t: keras.ops.sin(t))(keras.layers.Dense(16)(features))
    source.model = keras.Model(features, keras.layers.Dense(4, name="logits")(waves))
    calibration = make_batches(source, 1, 2)
    route = route_for("keras", "tflite", quantize="int8")

    def run(allow_float):
        request = ExportRequest("tflite", output_names=["logits"], sample_inputs=calibration[0], quantize="int8",
                                calibration=calibration, allow_float=allow_float)
        return route.export(source, request, tmp_path / "m.tflite", progress=lambda message: None)

    with pytest.raises(Incompatible, match="no int8 form for SIN"):
        run(False)
    assert not (tmp_path / "m.tflite").exists()
    assert run(True).quantization["float_fallback"] is True


def onnx_float_inputs_not_dequantized(path) -> list[str]:
    """Compute nodes with a float input that no DequantizeLinear writes."""
    import onnx

    model = onnx.load(str(path))
    types = {v.name: v.type.tensor_type.elem_type
             for v in (*onnx.shape_inference.infer_shapes(model).graph.value_info, *model.graph.input)}
    types |= {t.name: t.data_type for t in model.graph.initializer}
    dequantized = {out for node in model.graph.node if node.op_type == "DequantizeLinear" for out in node.output}
    return [f"{node.op_type} {name}" for node in model.graph.node
            if node.op_type not in ("QuantizeLinear", "DequantizeLinear", "Shape")
            for name in node.input if types.get(name) == onnx.TensorProto.FLOAT and name not in dequantized]


@pytest.mark.parametrize("framework", ["keras", "torch"])
def test_onnx_int8_is_a_qdq_graph(tmp_path, framework):
    import onnxruntime

    source, feeds, path, result = export(framework, "onnx", tmp_path)

    assert onnx_float_inputs_not_dequantized(path) == []
    precision = FORMATS["onnx"].open(path).precision()
    assert precision.mode == "int8" and precision.float_ops == ()
    assert result.quantization == {"mode": "int8", "io": "float", "float_fallback": False,
                                   "method": result.quantization["method"], "preparation": "quant_pre_process"}
    assert "quantize_static (QDQ" in result.quantization["method"]
    # Only the artifact (and its external data) is left: the float model's folder is gone.
    assert {p.name for p in tmp_path.iterdir()} <= {path.name, f"{path.name}.data"}
    session = onnxruntime.InferenceSession(str(path))
    produced = [session.run(None, feed)[0] for feed in feeds]
    assert sqnr_db([source.run(feed)[2][0] for feed in feeds], produced) > MIN_SQNR_DB


@pytest.mark.parametrize("framework, fmt, io, quantize", [
    ("torch", "onnx", "int8", "int8"),  # QDQ artifacts keep float I/O
    ("keras", "tflite", "uint8", None),  # --io needs --quantize int8
])
def test_io_refusals_are_bad_input(tmp_path, framework, fmt, io, quantize):
    source = Source("m", FRAMEWORKS[framework], None, [InputSpec("x", (1, 4), "float32")])
    feed = {"x": np.zeros((1, 4), np.float32)}
    request = ExportRequest(fmt, quantize=quantize, io=io, calibration=[feed] if quantize else [])
    with pytest.raises(BadInput, match=f"--io {io}"):
        route_for(framework, fmt).export(source, request, tmp_path / f"m.{fmt}", progress=lambda message: None)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_bert_onnx_int8_keeps_int64_token_ids(tmp_path):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
                        vocab_size=99)
    example = {"input_ids": torch.randint(0, 99, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.int64)}
    source = FRAMEWORKS["torch"].make_source("bert", BertModel(config).eval(), example, [], list)
    calibration = make_batches(source, 1, 8)
    path = tmp_path / "bert.onnx"
    result = route_for("torch", "onnx", quantize="int8").export(
        source, ExportRequest("onnx", output_names=source.run(calibration[0])[0], sample_inputs=calibration[0],
                              quantize="int8", calibration=calibration),
        path, progress=lambda message: None)

    precision = FORMATS["onnx"].open(path).precision()
    assert {(i.name, i.dtype) for i in precision.inputs} == {("input_ids", "int64"), ("attention_mask", "int64")}
    assert onnx_float_inputs_not_dequantized(path) == []
    assert result.quantization["float_fallback"] is False


@pytest.mark.slow
def test_bert_tflite_int8_falls_back_to_ai_edge_quantizer_and_keeps_integer_ids(tmp_path):
    from pathlib import Path

    from ai_edge_litert.interpreter import Interpreter

    from exporter import api

    out = tmp_path / "bert.tflite"
    models = Path(__file__).resolve().parents[3] / "fixtures" / "models" / "int8_models.py"
    report = api.export(f"{models}:bert_tiny", to="tflite", out=out, quantize="int8")

    assert report.exit_code == 0, report.summary_lines()
    precision = FORMATS["tflite"].open(out).precision()
    assert precision.mode == "int8" and precision.float_ops == ()
    assert report.quantization["float_ops"] == [] and report.quantization["float_fallback"] is False
    assert report.quantization["method"].startswith("ai-edge-quantizer 0.10.0 static_wi8_ai8")
    assert any(note.startswith("--quantize int8: PT2E left ") and "EMBEDDING_LOOKUP" in note for note in report.notes)
    inputs = Interpreter(model_path=str(out)).get_signature_runner().get_input_details()
    assert {name: np.dtype(detail["dtype"]).name for name, detail in inputs.items()} == {
        "input_ids": "int64", "attention_mask": "int64"}
    assert min(o.sqnr_db for o in report.outputs) > MIN_SQNR_DB
