"""verifiers.quantization.layers on real runtimes: a faithful int8 model has every tensor above 20 dB,
and the same model with one layer's scale ruined has that layer named as the first collapse,
though the layers after it inherit the error (and can be worse). ONNX: onnxruntime
quantize_static QDQ of an onnx.helper CNN; TFLite: TFLiteConverter full-integer PTQ of a Keras
CNN. Measured (8 feeds, seed 1): faithful ONNX lowest 31.9 dB (relu2), TFLite lowest 31.6 dB
(the depthwise output); one activation scale ×100 puts it at 7.4 dB (ONNX relu1) and 6.5 dB
(TFLite conv output); one weight scale ×20 puts that weight at -25.6 dB in both."""

import onnx
import pytest

from fixtures import make_broken_int8 as mbi
from verifiers.errors import BadInput
from verifiers.naming import shown
from verifiers.formats import FORMATS, ArtifactFormat, detect_format
from verifiers.formats.onnx.layers import float_from_qdq
from verifiers.quantization.layers import diagnose_layers, first_collapse, layer_errors

ONNX, TFLITE = FORMATS["onnx"], FORMATS["tflite"]

pytestmark = pytest.mark.filterwarnings("ignore:Statistics for quantized inputs were expected")

MIN_SQNR_DB = 20.0


@pytest.fixture(scope="module")
def onnx_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("int8_onnx")
    float_path, qdq_path = mbi.onnx_float_and_qdq(folder)
    return folder, float_path, qdq_path


@pytest.fixture(scope="module")
def onnx_feeds():
    return mbi.calibration_feeds("x", mbi.ONNX_INPUT_SHAPE, count=8, seed=1)


@pytest.fixture(scope="module")
def tflite_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("int8_tflite")
    float_content, int8_content = mbi.tflite_float_and_int8()
    (folder / "float.tflite").write_bytes(float_content)
    (folder / "int8.tflite").write_bytes(int8_content)
    return folder, folder / "float.tflite", folder / "int8.tflite"


@pytest.fixture(scope="module")
def tflite_feeds():
    return mbi.calibration_feeds("image", mbi.INPUT_SHAPE, count=8, seed=1)


def _ruined_onnx(onnx_pair, initializer, factor):
    folder, _, qdq_path = onnx_pair
    path = folder / f"ruined_{initializer}.onnx"
    onnx.save(mbi.scale_onnx_initializer(onnx.load(str(qdq_path)), initializer, factor), str(path))
    return path


def _ruined_tflite(tflite_pair, tensor, factor):
    folder, _, int8_path = tflite_pair
    path = folder / f"ruined_{factor}.tflite"
    path.write_bytes(mbi.scale_tflite_tensor(int8_path.read_bytes(), tensor, factor))
    return path


def test_every_format_runs_its_layers():
    assert {name for name, fmt in FORMATS.items()
            if type(fmt).layer_errors is not ArtifactFormat.layer_errors} == {"onnx", "tflite"}


# ---- ONNX ----------------------------------------------------------------------------------------


def test_a_faithful_qdq_model_has_no_collapse(onnx_pair, onnx_feeds):
    _, float_path, qdq_path = onnx_pair
    diagnosis = diagnose_layers(qdq_path, float_path, onnx_feeds, ONNX)
    by_name = {layer.tensor: layer for layer in diagnosis.layers}
    assert {"x", "relu1", "relu2", "pool", "flat", "logits", "w1", "w2", "w3", "b1"} <= set(by_name)
    assert by_name["relu1"].op_type == "Relu" and by_name["w2"].op_type == "initializer"
    assert min(layer.sqnr_db for layer in diagnosis.layers) > 28
    assert first_collapse(diagnosis.layers, MIN_SQNR_DB) is None
    assert diagnosis.layers == sorted(diagnosis.layers, key=lambda layer: layer.sqnr_db)
    assert diagnosis.summary(MIN_SQNR_DB).startswith("12 quantized tensor(s) compared; all reach 20 dB")


@pytest.mark.parametrize("initializer, factor, tensor", [
    ("relu1_scale", 100, "relu1"),  # an activation's Q/DQ pair: a grid 100 times coarser
    ("w2_scale", 20, "w2"),  # one weight's DequantizeLinear
])
def test_one_ruined_scale_is_the_first_collapse(onnx_pair, onnx_feeds, initializer, factor, tensor):
    _, float_path, _ = onnx_pair
    layers = layer_errors(_ruined_onnx(onnx_pair, initializer, factor), float_path, onnx_feeds, ONNX)
    collapse = first_collapse(layers, MIN_SQNR_DB)
    assert collapse is not None and collapse.tensor == tensor
    assert collapse.sqnr_db < 10
    later = [layer for layer in layers if layer.order > collapse.order and layer.tensor == "relu2"]
    assert later and later[0].sqnr_db < MIN_SQNR_DB  # inherited downstream


def test_without_a_float_model_the_qdq_model_is_its_own_reference(onnx_pair, onnx_feeds):
    _, _, qdq_path = onnx_pair
    rebuilt = float_from_qdq(onnx.load(str(qdq_path)))
    onnx.checker.check_model(rebuilt)
    assert not {node.op_type for node in rebuilt.graph.node} & {"QuantizeLinear", "DequantizeLinear"}
    assert [n.op_type for n in rebuilt.graph.node].count("Relu") >= 2  # the ReLUs quantize_static folded in
    faithful = diagnose_layers(qdq_path, None, onnx_feeds, ONNX)
    assert first_collapse(faithful.layers, MIN_SQNR_DB) is None
    assert all(layer.op_type != "initializer" for layer in faithful.layers)
    assert faithful.summary(MIN_SQNR_DB).endswith("float reference rebuilt from the QDQ model: weight rounding is not seen")
    ruined = diagnose_layers(_ruined_onnx(onnx_pair, "relu1_scale", 100), None, onnx_feeds, ONNX)
    assert first_collapse(ruined.layers, MIN_SQNR_DB).tensor == "relu1_DequantizeLinear_Output"


# ---- TFLite --------------------------------------------------------------------------------------


def test_a_faithful_int8_tflite_model_has_no_collapse(tflite_pair, tflite_feeds):
    _, float_path, int8_path = tflite_pair
    diagnosis = diagnose_layers(int8_path, float_path, tflite_feeds, TFLITE)
    by_name = {layer.tensor: layer for layer in diagnosis.layers}
    content = int8_path.read_bytes()
    assert by_name["serving_default_image:0"].op_type == "input"  # the int8 input, quantized from the feeds
    assert by_name[mbi.op_tensor(content, "CONV_2D", "output")].op_type == "CONV_2D"
    weight = mbi.op_tensor(content, "DEPTHWISE_CONV_2D", "weight")
    assert by_name[weight].op_type == "constant"  # per-axis, dequantized along dimension 3
    assert min(layer.sqnr_db for layer in diagnosis.layers) > 28
    assert first_collapse(diagnosis.layers, MIN_SQNR_DB) is None
    # arith.constant1, a bias the float model shares under one name, is matched by its place
    assert diagnosis.unmatched == 0


@pytest.mark.parametrize("op_name, slot, factor", [("CONV_2D", "output", 100), ("DEPTHWISE_CONV_2D", "weight", 20)])
def test_one_ruined_tflite_scale_is_the_first_collapse(tflite_pair, tflite_feeds, op_name, slot, factor):
    _, float_path, int8_path = tflite_pair
    tensor = mbi.op_tensor(int8_path.read_bytes(), op_name, slot)
    diagnosis = diagnose_layers(_ruined_tflite(tflite_pair, tensor, factor), float_path, tflite_feeds, TFLITE)
    collapse = first_collapse(diagnosis.layers, MIN_SQNR_DB)
    assert collapse is not None and collapse.tensor == tensor
    worst = diagnosis.layers[0]
    assert worst.order >= collapse.order
    assert f"first below 20 dB: {shown(tensor)} ({collapse.op_type})" in diagnosis.summary(MIN_SQNR_DB)


def test_what_cannot_be_diagnosed_is_one_bad_input(tflite_pair, tflite_feeds, tmp_path):
    _, _, int8_path = tflite_pair
    with pytest.raises(BadInput, match="needs its float model"):
        layer_errors(int8_path, None, tflite_feeds, TFLITE)
    (tmp_path / "model.pt").write_bytes(b"PK\x03\x04 a torch checkpoint")
    with pytest.raises(BadInput, match="neither an ONNX nor a TFLite file"):
        layer_errors(tmp_path / "model.pt", None, tflite_feeds, detect_format(tmp_path / "model.pt"))
