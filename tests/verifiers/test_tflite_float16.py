"""TFLite float16 artifacts (float16 weights: TFLiteConverter's float16 quantization, the route's
`--quantize fp16`) verified in float16 arithmetic too: LiteRT's CompiledModel with XNNPACK forced to
FP16 runs beside the interpreter, which dequantizes the weights and computes in float32. Oracles:
numpy's float16 arithmetic on the source's own weights, and the source model."""

import numpy as np
import pytest

from exporter import api
from fixtures.models import float16_models, keras_models
from fixtures.specs import MODELS
from verifiers.errors import BadInput
from verifiers.tflite_model import load_tflite
from verifiers.tflite_static_shapes import with_static_shapes

OVERFLOW = f"{MODELS / 'float16_models.py'}:keras_overflow_mlp"
MLP = f"{MODELS / 'float16_models.py'}:keras_mlp"
CONVNEXT = f"{MODELS / 'keras_models.py'}:convnext_block"


def _float16_tflite(builder, path):
    """The Keras model converted by TFLiteConverter with float16 weights (its float16 quantization)."""
    import tensorflow as tf

    built = builder()
    model = built[0] if isinstance(built, tuple) else built
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_types = [tf.float16]
    path.write_bytes(converter.convert())
    return path


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tflite_float16")
    return {"overflow": _float16_tflite(float16_models.keras_overflow_mlp, folder / "overflow.tflite"),
            "mlp": _float16_tflite(float16_models.keras_mlp, folder / "mlp.tflite"),
            "convnext": _float16_tflite(keras_models.convnext_block, folder / "convnext.tflite")}


def _exercised(report) -> bool:
    """Whether this CPU ran XNNPACK in FP16 (it needs FP16 arithmetic or, on x86, AVX2); where it
    could not, the report says so and the run is never green (exit 4)."""
    if report.arithmetic["float16"].startswith("not run"):
        assert report.exit_code == 4 and report.failures[0].data["variant"] == "float16", report.summary_lines()
        return False
    return True


def test_a_float16_tflite_artifact_that_overflows_fails_in_float16_arithmetic(converted):
    model, (x,) = float16_models.keras_overflow_mlp()
    kernel, bias = (w.astype(np.float16) for w in model.get_layer("fc1").get_weights())
    with np.errstate(over="ignore"):
        h = x.astype(np.float16) @ kernel + bias
        assert np.isinf(h * h).any()  # float16 arithmetic overflows on the example batch

    report = api.verify(converted["overflow"], source=OVERFLOW)

    assert set(report.arithmetic) == {"xnnpack", "builtin", "float16"}
    assert report.arithmetic["xnnpack"].startswith("float32")
    if _exercised(report):
        assert report.exit_code == 1, report.summary_lines()
        overflowed = [f for f in report.failures if f.data.get("variant") == "float16" and "dynamic" not in f.data]
        assert [f.data["cause"] for f in overflowed] == ["nonfinite"], [f.message for f in report.failures]
        assert "artifact -Inf" in overflowed[0].message or "artifact Inf" in overflowed[0].message
        # at the other batch sizes too, said as what it is (the error over the finite values is no figure)
        sized = [f for f in report.failures if f.data.get("variant") == "float16" and "dynamic" in f.data]
        assert sized and all("NaN/Inf differ" in f.message and "max abs err" not in f.message for f in sized), \
            [f.message for f in sized]
        # the interpreter's own runs, in float32, return no Inf
        assert not any(f.data.get("cause") == "nonfinite" for f in report.failures if f.data.get("variant") != "float16")


def test_a_float16_tflite_artifact_in_range_passes_in_float16_arithmetic(converted):
    report = api.verify(converted["mlp"], source=MLP)

    if _exercised(report):
        assert report.exit_code == 0, report.summary_lines()
        assert report.arithmetic["float16"].startswith("float16: XNNPACK forced to FP16")
        assert report.variant_outputs["float16"] and all(o.passed for o in report.variant_outputs["float16"])
        assert [g["status"] for g in report.gelu] == ["kept"]


def test_a_float32_tflite_artifact_runs_the_two_ways_it_did(tmp_path):
    assert api.export(MLP, to="tflite", out=tmp_path / "mlp.tflite").exit_code == 0

    report = api.verify(tmp_path / "mlp.tflite", source=MLP)

    assert report.exit_code == 0 and report.arithmetic == {}, report.summary_lines()


def test_a_partly_delegated_float16_tflite_artifact_runs_in_float16_at_every_batch_size(converted):
    """The ConvNeXt block's Dense over a 4-D input is a RESHAPE fed by SHAPE and GATHER, which XNNPACK
    does not take: LiteRT's CompiledModel runs it partly delegated and, at a batch size other than the
    file's, sized its output buffer from the file (a heap overflow, SIGABRT). Compiled at each run's
    shapes, it runs at the sizes the check asks for."""
    report = api.verify(converted["convnext"], source=CONVNEXT)

    if _exercised(report):
        assert report.exit_code == 0, report.summary_lines()
        assert report.arithmetic["float16"].endswith("the ops XNNPACK does not take compute in float32")
        assert report.variant_outputs["float16"] and all(o.passed for o in report.variant_outputs["float16"])
        assert [(d["axis"], d["status"]) for d in report.dynamic] == [(0, "pass")], report.dynamic
        assert {1, 2} <= set(report.dynamic[0]["sizes"]), report.dynamic


def test_static_shapes_rewritten_in_the_file_are_what_the_interpreter_runs_at(converted):
    """Oracle: LiteRT's interpreter, on the original file resized to the batch, and on the rewritten one."""
    from ai_edge_litert.interpreter import Interpreter

    model = load_tflite(converted["convnext"])
    graph = model.subgraphs[0]
    (given,), (made,) = graph.inputs, graph.outputs
    x = np.random.default_rng(1).standard_normal((3, 8, 8, 16)).astype(np.float32)
    resized = Interpreter(model_path=str(converted["convnext"]))
    resized.resize_tensor_input(resized.get_input_details()[0]["index"], x.shape)
    resized.allocate_tensors()
    resized.set_tensor(resized.get_input_details()[0]["index"], x)
    resized.invoke()
    expected = resized.get_tensor(resized.get_output_details()[0]["index"])

    rewritten = Interpreter(model_content=with_static_shapes(model, {given: (3, 8, 8, 16), made: (3, 8, 8, 16)}))
    rewritten.allocate_tensors()
    assert list(rewritten.get_input_details()[0]["shape"]) == [3, 8, 8, 16]
    assert list(rewritten.get_output_details()[0]["shape"]) == [3, 8, 8, 16]
    rewritten.set_tensor(rewritten.get_input_details()[0]["index"], x)
    rewritten.invoke()
    np.testing.assert_array_equal(rewritten.get_tensor(rewritten.get_output_details()[0]["index"]), expected)

    with pytest.raises(BadInput, match="is \\[-1, 8, 8, 16\\] in the file"):
        with_static_shapes(model, {given: (3, 9, 8, 16)})  # a fixed dim
    with pytest.raises(BadInput):
        with_static_shapes(model, {given: (3, 8, 8)})  # another rank
