"""Keras 3 -> TFLite through tf.lite.TFLiteConverter, run in ai-edge-litert (XNNPACK and builtin)."""


import numpy as np
import pytest

from verifiers.errors import BadInput, Incompatible
from exporter.frameworks import FRAMEWORKS
from exporter.routes import ExportRequest, route_for
from exporter.frameworks import load_source
from exporter.sources import make_batches
from verifiers.sizes import DynamicAxis
from fixtures.specs import keras_model
from verifiers.gelu.catalogue import TANH
from verifiers.formats.tflite.gelu_sites import find_tflite_sites
from verifiers.runtimes import runtime_for
from verifiers.runtimes.litert_runner import LiteRtRunner
from verifiers.tflite_model import load_tflite

MODELS = ["functional_activation", "functional_approximate", "functional_ops", "convnext_block"]
EXACT = {"functional_activation": True, "functional_approximate": False, "functional_ops": False,
         "convnext_block": True}
# Max abs error against Keras. float32: both interpreters agree with Keras to ~5e-7.
# fp16 weights: ~1.5e-3 on these models (weights rounded to float16, compute in float32).
# dynamic-int8: ~1.5e-2 on the ConvNeXt block (int8 weights, activations quantised per batch).
ATOL = {None: 1e-5, "fp16": 5e-3, "dynamic-int8": 5e-2}


def gelu_flags(path) -> list[bool]:
    """GeluOptions.approximate of every GELU builtin (no options table means exact)."""
    return [site.claimed == TANH for site in find_tflite_sites(load_tflite(path)) if site.op == "GELU"]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """export(name, quantize) -> (source, feeds, reference, path, result), converted once per module."""
    cache = {}
    folder = tmp_path_factory.mktemp("keras_tflite")

    def _export(name, quantize=None, **request):
        key = (name, quantize, tuple(sorted(request.items())))
        if key not in cache:
            source = load_source(keras_model(name))
            feeds = make_batches(source, 0, 2)
            reference = [source.run(feed) for feed in feeds]
            path = folder / f"{name}_{quantize}_{len(cache)}.tflite"
            result = route_for("keras", "tflite").export(
                source, ExportRequest("tflite", output_names=reference[0][0], sample_inputs=feeds[0],
                                      quantize=quantize, **request),
                path, progress=lambda m: None)
            cache[key] = (source, feeds, reference, path, result)
        return cache[key]

    return _export


def max_errors(runner, feeds, reference) -> dict[str, float]:
    errors = dict.fromkeys(runner.variants, 0.0)
    for feed, (names, _, arrays) in zip(feeds, reference):
        assert [o.name for o in runner.outputs] == names
        for key, outputs in runner.run_all({i.name: feed[i.name] for i in runner.inputs}).items():
            errors[key] = max(errors[key], *(float(np.abs(a - b).max()) for a, b in zip(outputs, arrays)))
    return errors


@pytest.mark.parametrize("quantize", [None, "fp16"])
@pytest.mark.parametrize("name", MODELS)
def test_matches_keras_in_both_interpreters(export, name, quantize):
    source, feeds, reference, path, result = export(name, quantize)

    assert path.read_bytes()[4:8] == b"TFL3"
    assert result.exporter.startswith("tf.lite.TFLiteConverter")
    runner = runtime_for("tflite")(path)
    assert [i.name for i in runner.inputs] == source.input_names
    errors = max_errors(runner, feeds, reference)
    interpreters = [error for variant, error in errors.items() if variant != "float16"]
    assert max(interpreters) < ATOL[quantize], errors
    assert errors.get("float16", 0.0) < 1e-2, errors  # XNNPACK forced to FP16: float16 arithmetic's rounding
    assert bool(result.notes) == (quantize is not None)


@pytest.mark.parametrize("name", MODELS)
def test_every_gelu_spelling_becomes_the_builtin_with_its_flavour(export, name):
    path = export(name)[3]
    ops = [code.name for code in load_tflite(path).opcodes]
    assert "GELU" in ops and not any(op.startswith("Flex") for op in ops)
    assert gelu_flags(path) == [not EXACT[name]]


def test_fp16_keeps_gelu_in_float32_with_its_flag(export):
    path = export("functional_activation", "fp16")[3]
    assert "DEQUANTIZE" in [code.name for code in load_tflite(path).opcodes]
    assert gelu_flags(path) == [False]


def test_dynamic_int8_quantises_the_convnext_block(export):
    _, feeds, reference, path, result = export("convnext_block", "dynamic-int8")
    errors = max_errors(LiteRtRunner(path), feeds, reference)
    assert 1e-4 < max(errors.values()) < ATOL["dynamic-int8"], errors  # int8 weights: visible, bounded
    assert gelu_flags(path) == [False]
    assert not any("quantised no weight" in note for note in result.notes)


def test_dynamic_int8_on_tiny_weights_says_nothing_was_quantised(export):
    _, feeds, reference, path, result = export("functional_activation", "dynamic-int8")
    assert any("quantised no weight" in note for note in result.notes), result.notes
    assert max(max_errors(LiteRtRunner(path), feeds, reference).values()) < 1e-5


def test_signature_takes_the_source_names(export):
    source, _, reference, path, _ = export("sequential_ops")
    runner = LiteRtRunner(path)
    assert runner.signature == "serving_default"
    assert [i.name for i in runner.inputs] == source.input_names  # keras_tensor_N, not args_0
    assert [o.name for o in runner.outputs] == reference[0][0] == ["output"]


def test_dynamic_batch_axis(export):
    source, _, _, path, _ = export("functional_activation", dynamic=(DynamicAxis("features", 0),))
    runner = LiteRtRunner(path)
    assert runner.inputs[0].shape == [None, 16]
    batch = np.random.default_rng(1).standard_normal((5, 16)).astype("float32")
    expected = source.run({"features": batch})[2][0]
    for outputs in runner.run_all({"features": batch}).values():
        assert outputs[0].shape == (5, 4)
        np.testing.assert_allclose(outputs[0], expected, atol=1e-5)


def _source(model):
    return FRAMEWORKS["keras"].make_source("in-test model", model, None, [], list)


def test_several_inputs_and_outputs_keep_their_names_and_order(tmp_path):
    import keras

    keras.utils.set_random_seed(0)
    second, first = keras.Input((4,), name="zeta"), keras.Input((6,), name="alpha")
    joined = keras.layers.Concatenate()([keras.layers.Dense(5)(second), keras.layers.Dense(5)(first)])
    model = keras.Model([second, first], {"wide": keras.layers.Dense(7)(joined), "narrow": keras.layers.Dense(2)(joined)})
    source = _source(model)
    feed = make_batches(source, 0, 1)[0]
    names, _, arrays = source.run(feed)
    route_for("keras", "tflite").export(source, ExportRequest("tflite", output_names=names, sample_inputs=feed),
                                       tmp_path / "m.tflite", progress=lambda m: None)
    runner = LiteRtRunner(tmp_path / "m.tflite")
    assert [i.name for i in runner.inputs] == ["zeta", "alpha"] == source.input_names
    assert sorted(o.name for o in runner.outputs) == sorted(names)
    by_name = dict(zip([o.name for o in runner.outputs], runner.run(feed)))
    for name, expected in zip(names, arrays):
        np.testing.assert_allclose(by_name[name], expected, atol=1e-5)


def test_an_op_without_builtin_is_exit_4_naming_it(tmp_path):
    import keras
    import tensorflow as tf

    features = keras.Input((8,), name="features")
    model = keras.Model(features, keras.layers.Lambda(lambda t: tf.math.erf(t) * t)(keras.layers.Dense(8)(features)))
    with pytest.raises(Incompatible, match="Erf") as caught:
        route_for("keras", "tflite").export(_source(model), ExportRequest("tflite"), tmp_path / "m.tflite",
                                           progress=lambda m: None)
    assert "FlexErf" in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.kind == "target"
    assert not (tmp_path / "m.tflite").exists()


def test_a_quantize_mode_the_route_does_not_know_is_bad_input(tmp_path):
    # (--opset for a TFLite export is refused before anything loads: tests/cli/test_contract.py)
    source = load_source(keras_model("functional_activation"))
    with pytest.raises(BadInput, match="--quantize"):
        route_for("keras", "tflite").export(source, ExportRequest("tflite", quantize="int4"), tmp_path / "m.tflite",
                                           progress=lambda m: None)
