"""verifiers.formats.tflite.int8_spec on a TFLiteConverter full-integer model (Conv2D,
DepthwiseConv2D, Dense, sigmoid) and on the same model with quantization parameters written into
its flatbuffer; the per-axis quantization verifiers.tflite_model reads."""

import pytest

from fixtures import make_broken_int8 as mbi
from verifiers.formats.tflite.int8_spec import int8_spec_violations
from verifiers.tflite_model import parse_tflite

pytestmark = pytest.mark.filterwarnings("ignore:Statistics for quantized inputs were expected")



@pytest.fixture(scope="module")
def int8_content():
    return mbi.tflite_float_and_int8()[1]


@pytest.fixture(scope="module")
def names(int8_content):
    """Tensor names by role (Keras numbers its layers per process)."""
    return {role: mbi.op_tensor(int8_content, op, slot) for role, op, slot in [
        ("conv_weight", "CONV_2D", "weight"), ("conv_output", "CONV_2D", "output"),
        ("depthwise_weight", "DEPTHWISE_CONV_2D", "weight"), ("sigmoid_output", "LOGISTIC", "output")]}


def _tensor(model, name):
    return next(t for t in model.subgraphs[0].tensors if t.name == name)


def test_per_axis_quantization_is_read(int8_content, names):
    model = parse_tflite(int8_content)
    conv, depthwise = _tensor(model, names["conv_weight"]), _tensor(model, names["depthwise_weight"])
    assert (len(conv.scales), conv.quantized_dimension, conv.zero_points) == (8, 0, (0,) * 8)
    assert (len(depthwise.scales), depthwise.quantized_dimension) == (8, 3)
    assert not conv.quantized and conv.scale is None  # the per-tensor fields keep their meaning
    output = _tensor(model, names["sigmoid_output"])
    assert output.quantized and output.scales == (output.scale,) == (1 / 256,) and output.zero_points == (-128,)


def test_a_converter_int8_model_follows_the_spec(int8_content):
    assert int8_spec_violations(parse_tflite(int8_content)) == []
    assert int8_spec_violations(parse_tflite(mbi.tflite_float_and_int8()[0])) == []  # float: nothing to check


def test_a_weight_zero_point_and_a_logistic_scale_are_reported(int8_content, names):
    broken = mbi.set_tflite_quantization(int8_content, names["conv_weight"], zero_point=3)
    broken = mbi.set_tflite_quantization(broken, names["sigmoid_output"], scale=1 / 128)
    violations = int8_spec_violations(parse_tflite(broken))
    assert [(v.op_index, v.op_name, v.tensor, v.rule, v.found) for v in violations] == [
        (0, "CONV_2D", names["conv_weight"], "weight-zero-point", 3),
        (4, "LOGISTIC", names["sigmoid_output"], "fixed-output", "(0.0078125, -128)"),
    ]
    assert violations[1].message == (f"op 4 LOGISTIC: output {names['sigmoid_output']} has (scale, zero point) "
                                     "(0.0078125, -128), the int8 spec fixes (0.00390625, -128)")
    assert all("\n" not in v.message for v in violations)


def test_a_ruined_activation_scale_breaks_the_next_bias_scale(int8_content, names):
    """The bias of the op reading a rescaled activation no longer has input scale × weight scale."""
    broken = mbi.scale_tflite_tensor(int8_content, names["conv_output"], 100)
    violations = int8_spec_violations(parse_tflite(broken))
    assert [(v.op_name, v.rule) for v in violations] == [("DEPTHWISE_CONV_2D", "bias-scale")]
    assert "the int8 spec wants input scale × weight scale" in violations[0].message


def test_a_per_tensor_conv_weight_is_reported(int8_content, names):
    violations = int8_spec_violations(parse_tflite(mbi.make_per_tensor(int8_content, names["depthwise_weight"])))
    assert ("weight-per-axis", "one scale (per-tensor)") in [(v.rule, v.found) for v in violations]
