"""verifiers.precision: the precision of real conversions, read from the flatbuffer or the ONNX
protobuf. TFLite artifacts come from tf.lite.TFLiteConverter (float, dynamic range, float16, full
integer with int8 or float I/O), ONNX ones from onnx.helper and onnxruntime.quantization (QDQ,
per channel; one op type left out; dynamic)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.verifiers.test_target_check import _built_once, _shared_folder
from verifiers.formats import open_artifact

TFLITE_MLPS = ("float", "dynamic", "fp16", "int8", "int8_float_io", "int8_dynamic_batch")
ONNX_MODELS = ("float", "qdq", "qdq_no_matmul", "dynamic")


def _keras_mlp(name: str) -> bytes:
    """Dense(64, relu)-Dense(64, relu)-Dense(4) on 32 features (batch 1, or None for *_dynamic_batch),
    converted with tf.lite.TFLiteConverter as `name` says."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    x = keras.Input((32,), batch_size=None if name.endswith("dynamic_batch") else 1, name="x")
    hidden = keras.layers.Dense(64, activation="relu")(keras.layers.Dense(64, activation="relu")(x))
    converter = tf.lite.TFLiteConverter.from_keras_model(keras.Model(x, keras.layers.Dense(4)(hidden)))
    if name != "float":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if name == "fp16":
        converter.target_spec.supported_types = [tf.float16]
    if name.startswith("int8"):
        rng = np.random.default_rng(0)

        def dataset():
            for _ in range(8):
                yield [rng.standard_normal((1, 32)).astype(np.float32)]

        converter.representative_dataset = dataset
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if name != "int8_float_io":
            converter.inference_input_type = tf.int8
            converter.inference_output_type = tf.int8
    return bytes(converter.convert())


def _float_onnx() -> onnx.ModelProto:
    """Conv(3->4, 3x3)-Relu-Flatten-MatMul(144->10)-Add on a 1x3x8x8 input, weights fixed."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("conv_w", (4, 3, 3, 3)), ("conv_b", (4,)), ("fc_w", (144, 10)), ("fc_b", (10,)))]
    graph = helper.make_graph([
        helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["conv"], name="conv"),
        helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
        helper.make_node("Flatten", ["relu"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "fc_w"], ["fc"], name="fc"),
        helper.make_node("Add", ["fc", "fc_b"], ["y"], name="fc_bias"),
    ], "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def _onnx_model(name: str, folder: Path) -> bytes:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, \
        quantize_static

    float_path = folder / "float_source.onnx"
    onnx.save(_float_onnx(), float_path)
    if name == "float":
        return float_path.read_bytes()

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.batches = iter([{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.batches, None)

    out = folder / f"{name}_quantized.onnx"
    if name == "dynamic":
        quantize_dynamic(float_path, out, weight_type=QuantType.QInt8)
    else:
        kept = {"op_types_to_quantize": ["Conv", "Relu", "Flatten", "Add"]} if name == "qdq_no_matmul" else {}
        quantize_static(float_path, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, **kept)
    return out.read_bytes()


@pytest.fixture(scope="module")
def tflite_mlp(tmp_path_factory):
    """name -> path of a .tflite conversion of the MLP (built once per session)."""
    return _built_once(_shared_folder(tmp_path_factory), "precision_tflite", TFLITE_MLPS, ".tflite", _keras_mlp)


@pytest.fixture(scope="module")
def onnx_convnet(tmp_path_factory):
    """name -> path of the ConvNet: float, QDQ (per channel), QDQ without MatMul, dynamic."""
    folder = _shared_folder(tmp_path_factory)
    work = folder / "precision_onnx_work"
    work.mkdir(parents=True, exist_ok=True)
    return _built_once(folder, "precision_onnx", ONNX_MODELS, ".onnx", lambda name: _onnx_model(name, work))


# ---- TFLite ----------------------------------------------------------------------------------------


def test_float_mlp_is_float_from_its_first_op(tflite_mlp):
    precision = open_artifact(tflite_mlp("float")).precision()
    assert precision.mode == "float"
    assert [op.op_type for op in precision.float_ops] == ["FULLY_CONNECTED"] * 3
    first = precision.float_ops[0]
    assert first.dtype == "float32" and first.tensor == precision.inputs[0].name
    assert [(io.dtype, io.scale, io.zero_point) for io in precision.inputs] == [("float32", None, None)]


def test_dynamic_range_mlp_keeps_float_activations(tflite_mlp):
    precision = open_artifact(tflite_mlp("dynamic")).precision()
    assert precision.mode == "dynamic-int8"
    assert len(precision.float_ops) == 3 and {op.dtype for op in precision.float_ops} == {"float32"}


def test_float16_mlp_counts_its_weight_dequantizes_in_the_ops_they_feed(tflite_mlp):
    precision = open_artifact(tflite_mlp("fp16")).precision()
    assert precision.mode == "fp16"
    assert [op.op_type for op in precision.float_ops] == ["FULLY_CONNECTED"] * 3  # no DEQUANTIZE


@pytest.mark.parametrize("name", ["int8", "int8_float_io"])
def test_full_integer_mlp_has_no_float_op(tflite_mlp, name):
    precision = open_artifact(tflite_mlp(name)).precision()
    assert precision.mode == "int8" and precision.float_ops == ()
    (x,) = precision.inputs
    if name == "int8":
        assert x.dtype == "int8" and x.scale > 0 and x.zero_point is not None
    else:  # the QUANTIZE of the input and the DEQUANTIZE of the output are the float boundary
        assert x.dtype == "float32" and x.scale is None and precision.outputs[0].dtype == "float32"


# ---- ONNX ------------------------------------------------------------------------------------------


def test_float_onnx_is_float(onnx_convnet):
    precision = open_artifact(onnx_convnet("float")).precision()
    assert precision.mode == "float"
    assert [op.node for op in precision.float_ops] == ["conv", "relu", "flatten", "fc", "fc_bias"]
    assert precision.float_ops[0].tensor == "x" and precision.inputs[0].dtype == "float32"


def test_qdq_onnx_is_int8_with_float_io(onnx_convnet):
    precision = open_artifact(onnx_convnet("qdq")).precision()
    assert precision.mode == "int8" and precision.float_ops == ()
    assert [io.dtype for io in (*precision.inputs, *precision.outputs)] == ["float32", "float32"]


def test_op_type_left_out_of_quantization_is_the_float_op(onnx_convnet):
    precision = open_artifact(onnx_convnet("qdq_no_matmul")).precision()
    assert precision.mode == "mixed"
    (matmul,) = [op for op in precision.float_ops if op.op_type == "MatMul"]
    assert precision.float_ops[0] == matmul and matmul.tensor == "fc_w"  # the float weight


def test_dynamic_quantization_is_dynamic_int8(onnx_convnet):
    precision = open_artifact(onnx_convnet("dynamic")).precision()
    assert precision.mode == "dynamic-int8" and precision.float_ops
