"""verifiers.quantization.metrics: SQNR, cosine and top-1 agreement on known arrays; judging an integer
output; quantize/dequantize against ai-edge-litert's QUANTIZE kernel."""

import math

import numpy as np
import pytest

from verifiers.quantization.metrics import (
    IntegerThresholds, cosine, dequantize, judge_integer_output, looks_like_classes, quantize, sqnr_db,
    top1_agreement,
)


def test_sqnr_of_x_plus_noise_of_known_power():
    rng = np.random.default_rng(0)
    refs = [rng.standard_normal((64, 256)) * 2.0 for _ in range(4)]  # signal power 4
    arts = [x + rng.standard_normal(x.shape) * 0.02 for x in refs]  # noise power 4e-4: 40 dB
    assert sqnr_db(refs, arts) == pytest.approx(40.0, abs=0.1)


def test_sqnr_pools_every_batch_before_the_ratio():
    refs = [np.ones(4), np.ones(4) * 3]
    arts = [np.ones(4), np.ones(4) * 3 + 0.1]  # noise only in the second batch
    expected = 10 * math.log10((4 * 1 + 4 * 9) / (4 * 0.01))
    assert sqnr_db(refs, arts) == pytest.approx(expected)


def test_sqnr_edge_cases():
    x = np.arange(6, dtype=np.float32)
    assert sqnr_db([x], [x.copy()]) == math.inf
    assert sqnr_db([np.zeros(3)], [np.zeros(3)]) == math.inf
    assert sqnr_db([np.zeros(3)], [np.ones(3)]) == -math.inf
    assert sqnr_db([np.array([1.0, np.nan])], [np.array([1.0, np.nan])]) == math.inf
    assert sqnr_db([np.array([1.0, 2.0])], [np.array([1.0, np.inf])]) == -math.inf
    with pytest.raises(ValueError, match="shapes differ"):
        sqnr_db([np.zeros(3)], [np.zeros(4)])


def test_cosine():
    x = np.array([1.0, 2.0, 3.0])
    assert cosine([x], [2 * x]) == pytest.approx(1.0)
    assert cosine([x], [-x]) == pytest.approx(-1.0)
    assert cosine([np.array([1.0, 0.0])], [np.array([0.0, 1.0])]) == pytest.approx(0.0)
    assert cosine([np.zeros(2)], [np.zeros(2)]) == 1.0


def test_top1_agreement_counts_rows_and_positions():
    ref = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1]], np.float32)
    art = np.array([[0.2, 0.7, 0.1], [0.1, 0.2, 0.7]], np.float32)  # first row agrees, second not
    assert top1_agreement([ref, ref], [art, ref]) == pytest.approx(3 / 4)
    logits = np.random.default_rng(0).standard_normal((1, 5, 50)).astype(np.float32)  # [batch, seq, vocab]
    noisy = logits.copy()
    noisy[0, 2] = -logits[0, 2]  # one position's arg-max moves
    assert top1_agreement([logits], [noisy], "logits") == pytest.approx(4 / 5)


def test_the_classes_rule():
    f32 = np.dtype(np.float32)
    assert looks_like_classes((1, 1000), f32)
    assert looks_like_classes((2, 7, 32000), f32, "logits")
    assert not looks_like_classes((1, 1), f32)  # one score: nothing to arg-max
    assert not looks_like_classes((10,), f32)  # no rows
    assert not looks_like_classes((1, 8, 8, 16), f32)  # a feature map
    assert not looks_like_classes((1, 1000), np.dtype(np.int64))  # already indices
    assert not looks_like_classes((1, 7, 768), f32, "last_hidden_state")
    assert not looks_like_classes((1, 512), f32, "pooler_output")
    assert top1_agreement([np.zeros((1, 8, 8, 16), np.float32)], [np.zeros((1, 8, 8, 16), np.float32)]) is None


def test_judge_integer_output_passes_and_fails_in_one_line():
    rng = np.random.default_rng(1)
    refs = [rng.standard_normal((16, 10)).astype(np.float32)]
    close = [refs[0] + rng.standard_normal((16, 10)).astype(np.float32) * 1e-3]
    metrics, message = judge_integer_output("logits", refs, close, IntegerThresholds())
    assert message is None
    assert set(metrics) == {"sqnr_db", "cosine", "top1_agreement"}
    assert metrics["sqnr_db"] > 50 and metrics["top1_agreement"] == 1.0
    far = [refs[0] + rng.standard_normal((16, 10)).astype(np.float32) * 0.5]
    metrics, message = judge_integer_output("logits", refs, far, IntegerThresholds())
    assert message == (f"output logits: SQNR {metrics['sqnr_db']:.1f} dB (min 20), top-1 agreement "
                       f"{metrics['top1_agreement']:.2f} (min 0.95), cosine {metrics['cosine']:.3f}")
    maps = [rng.standard_normal((1, 4, 4, 8)).astype(np.float32)]
    _, message = judge_integer_output("features", maps, [maps[0] * 0.5], IntegerThresholds(min_sqnr_db=30))
    assert message.startswith("output features: SQNR 6.0 dB (min 30), cosine 1.000")


def test_dequantize_per_tensor_and_per_axis():
    q = np.array([[-128, 0, 127], [2, 4, 6]], np.int8)
    assert np.array_equal(dequantize(q, 0.5, -128), (q.astype(np.float32) + 128) * 0.5)
    per_row = dequantize(q, np.array([1.0, 0.25], np.float32), np.array([0, 2]), axis=0)
    assert np.array_equal(per_row[1], np.array([0.0, 0.5, 1.0], np.float32))
    assert np.array_equal(quantize(dequantize(q, 0.1, 3), 0.1, 3, np.int8), q)


def test_quantize_rounds_half_to_even_on_the_reciprocal_and_clamps():
    assert quantize(np.array([0.5, 1.5, 2.5, -0.5, -1.5]), 1.0, 0, np.int8).tolist() == [0, 2, 2, 0, -2]
    assert quantize(np.array([1e6, -1e6]), 0.1, 0, np.int8).tolist() == [127, -128]
    assert quantize(np.array([-1.0]), 0.1, 0, np.uint8).tolist() == [0]


@pytest.mark.filterwarnings("ignore:Statistics for quantized inputs were expected")
def test_quantize_matches_the_interpreters_quantize_kernel():
    """A float-input int8 model starts with a QUANTIZE op: our integers are the interpreter's,
    on exact halfway inputs too (where division with half-away rounding differs)."""
    import keras
    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    keras.utils.set_random_seed(0)
    inputs = keras.Input((64,), batch_size=1)
    rng = np.random.default_rng(0)
    converter = tf.lite.TFLiteConverter.from_keras_model(keras.Model(inputs, keras.layers.Dense(4)(inputs)))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([rng.standard_normal((1, 64)).astype(np.float32)] for _ in range(8))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    interpreter = Interpreter(model_content=converter.convert(), experimental_preserve_all_tensors=True,
                              experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interpreter.allocate_tensors()
    quantized = next(d for d in interpreter.get_tensor_details() if d["name"] == "tfl.quantize")
    scale, zero_point = quantized["quantization"]
    x = ((rng.integers(-140, 140, (1, 64)) + 0.5) * np.float32(scale)).astype(np.float32)
    x[0, :8] = rng.standard_normal(8)
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    assert np.array_equal(interpreter.get_tensor(quantized["index"]), quantize(x, scale, zero_point, np.int8))
