"""What an artifact costs in its runtime (verifiers.measurement): `exportgate measure`, and
`--measure` on verify. No figure is asserted against a clock (bench/measure_agreement.py compares
the medians with onnxruntime's own timing loop); the tests hold the measurement's shape, its
statistics, and which runs it times."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from exporter import api
from fixtures.children import REPO
from fixtures.models import float16_models
from verifiers.measurement import MIN_RUNS, median_interval
from verifiers.runtimes import isolation

MLP = f"{REPO / 'examples/mlp.py'}:build"  # input [8, 16] float32


def test_the_median_interval_covers_the_true_median_95_percent_of_the_time():
    """Oracle: the exponential distribution's median, ln 2, and 4000 seeded samples of 30 times."""
    rng = np.random.default_rng(0)
    covered = 0
    for _ in range(4000):
        low, high = median_interval(list(rng.exponential(1.0, 30)))
        covered += low <= np.log(2) <= high
    assert 0.93 <= covered / 4000 <= 0.99, covered / 4000


@pytest.fixture(scope="module")
def dynamic_onnx(tmp_path_factory):
    """A MatMul and an exact Gelu (onnx.helper, opset 20) whose batch axis is dynamic."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [64, 64],
                                np.random.default_rng(0).standard_normal(64 * 64).astype(np.float32))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Gelu", ["h"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])], [weight])
    path = tmp_path_factory.mktemp("measure") / "dynamic.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))
    return path


def test_measure_times_the_batch_and_one_four_times_larger(dynamic_onnx):
    with isolation.limits(threads=1):  # --threads: a setting of the runtime worker
        report = api.measure(dynamic_onnx, measure_seconds=0.2)

    assert report.exit_code == 0, report.summary_lines()
    measured = report.measurement
    assert measured["runtime"] == "onnxruntime" and measured["threads"] == 1 and measured["larger_batch"] is None
    [small, large] = measured["timings"]
    assert (small["variant"], large["variant"]) == ("default", "default")
    assert large["batch"] == 4 * small["batch"]
    for timing in measured["timings"]:
        assert timing["runs"] >= MIN_RUNS
        assert timing["min_ms"] <= timing["low_ms"] <= timing["median_ms"] <= timing["high_ms"] <= timing["max_ms"]
        assert timing["median_ms"] <= timing["p90_ms"] <= timing["max_ms"]
        assert timing["items_per_second"] == pytest.approx(timing["batch"] / timing["median_ms"] * 1000)
    assert measured["peak_rss_mb"] >= measured["rss_before_load_mb"] > 0 and measured["load_seconds"] > 0
    assert report.artifact.size_bytes == dynamic_onnx.stat().st_size
    assert any(line.startswith("  measured in onnxruntime (1 thread(s))") for line in report.summary_lines())


def test_measure_takes_the_batch_shape_from_input(dynamic_onnx):
    report = api.measure(dynamic_onnx, inputs=["x:3x64:float32"], measure_seconds=0.1)

    assert [t["batch"] for t in report.measurement["timings"]] == [3, 12]


def test_measure_refuses_an_input_the_artifact_does_not_have(dynamic_onnx):
    report = api.measure(dynamic_onnx, inputs=["ids:3x64:int64"], measure_seconds=0.1)

    assert report.exit_code == 2
    assert "--input ids: the artifact has no such input (it has x)" in report.failures[0].message


def test_a_float16_tflite_artifact_is_timed_as_litert_runs_it_not_in_the_float16_emulation(tmp_path):
    """TFLiteConverter's float16 quantization: verify runs it a third way, XNNPACK forced to FP16,
    which predicts a GPU's arithmetic and is not how the CPU runs it."""
    import tensorflow as tf

    model, _ = float16_models.keras_mlp()
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_types = [tf.float16]
    path = tmp_path / "mlp.tflite"
    path.write_bytes(converter.convert())

    report = api.measure(path, measure_seconds=0.1)

    assert report.exit_code == 0, report.summary_lines()
    assert {t["variant"] for t in report.measurement["timings"]} == {"xnnpack", "builtin"}


def test_verify_measure_adds_the_measurement_and_keeps_the_verdict(shared_artifact, tmp_path, cli):
    artifact = shared_artifact(tmp_path, MLP, "mlp.onnx", to="onnx", opset=17)

    result = cli("verify", str(artifact), "--source", MLP, "--measure", "--measure-seconds", "0.1", "--json")

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [t["batch"] for t in report["measurement"]["timings"]] == [8]  # the example's; its batch axis is fixed
    assert report["measurement"]["larger_batch"] == "input input has no dynamic first axis"
    assert "measured in onnxruntime" in result.stderr
    assert api.verify(artifact, source=MLP).measurement == {}
