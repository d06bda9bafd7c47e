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
from exporter.checks.measurement import ROUNDS
from fixtures.children import REPO
from fixtures.models import float16_models
from verifiers.measurement import MIN_RUNS, median_interval, overruns
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


def test_a_batch_the_artifact_does_not_run_on_is_bad_input_naming_its_shapes(tmp_path):
    """A Gather of a 2-row table: indices of 5 are not ones it takes, which onnxruntime says; the
    measurement says so in one line, with the shapes it fed and what to give."""
    table = helper.make_tensor("table", TensorProto.FLOAT, [2, 4], np.zeros(8, np.float32))
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["rows"])], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
                              [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["n", 4])], [table])
    path = tmp_path / "gather.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))

    report = api.measure(path, inputs=["ids:3:int64:5..6"], measure_seconds=0.05)
    assert report.exit_code == 2
    message = report.failures[0].message
    assert message.startswith("gather.onnx does not run on the batch measured (ids 3): ")
    assert message.endswith("give each input's shape and range with --input NAME:SHAPE:DTYPE[:LOW..HIGH]")


def test_the_profile_by_module_names_the_modules_of_a_transformers_bert(shared_artifact, tmp_path):
    """torch.onnx's TorchScript exporter names each node by its module's scope; onnxruntime's profile,
    summed by those, names BERT's own modules (the oracle: the model's named_modules), its
    feed-forward layers among them, and adds up to the profile by op type."""
    from fixtures.models import hf_models
    from verifiers.measurement import MADE_BY_RUNTIME, ROOT

    artifact = shared_artifact(tmp_path, f"{hf_models.__file__}:bert", "bert.onnx", to="onnx", opset=17,
                               exporter="torchscript")
    report = api.measure(artifact, measure_seconds=0.1)
    assert report.exit_code == 0, report.summary_lines()
    modules = set(report.measurement["profile_by_module"])
    # as recorded: under the module exportgate calls BERT's keywords through (its attribute `model`)
    named = {"model", *(f"model.{name}" for name, _ in hf_models.bert()[0].named_modules() if name)}
    assert modules - {ROOT, MADE_BY_RUNTIME} <= named, modules - named
    assert {"model.encoder.layer.0.intermediate.dense", "model.encoder.layer.1.output.dense"} <= modules
    assert sum(report.measurement["profile_by_module"].values()) == pytest.approx(
        sum(report.measurement["profile"].values()))
    assert any(line.startswith("    time by module (the scopes the exporter recorded): ")
               for line in report.summary_lines())


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


def _timed(median: float, low: float, high: float, batch: int = 1, variant: str = "default") -> dict:
    return {"variant": variant, "batch": batch, "runs": 30, "median_ms": median, "p90_ms": high, "low_ms": low,
            "high_ms": high, "min_ms": low, "max_ms": high, "items_per_second": batch / median * 1000}


def _measured(*timings: dict, peak: float = 100.0, profile: dict | None = None) -> dict:
    return {"runtime": "onnxruntime", "threads": 2, "cpus": 2, "load_seconds": 0.1, "rss_before_load_mb": 40.0,
            "peak_rss_mb": peak, "load_average": (0.5, 0.5), "timings": list(timings), "larger_batch": None,
            "profile": profile or {}}


def test_a_budget_is_over_only_when_the_whole_interval_is():
    found, notes = overruns(_measured(_timed(10.0, 9.0, 11.0)), 8.9, None, None, 0.1)
    assert [(o.metric, o.measured, o.limit) for o in found] == [("latency", 10.0, 8.9)]
    assert found[0].message == "latency 10 ms is over the budget of 8.9 ms (1.12x)"

    found, notes = overruns(_measured(_timed(10.0, 9.0, 11.0)), 10.5, None, None, 0.1)
    assert found == [] and notes and "around the budget of 10.5 ms" in notes[0]

    found, _ = overruns(_measured(_timed(10.0, 9.0, 11.0), peak=120.0), None, 100.0, None, 0.1)
    assert [(o.metric, o.measured, o.limit) for o in found] == [("peak memory", 120.0, 100.0)]


def test_a_regression_is_decided_beyond_both_intervals_and_names_the_op_types_that_grew():
    base = _measured(_timed(10.0, 9.5, 10.5), profile={"MatMul": 6.0, "Gelu": 1.0})
    # 10% over the baseline's high end is 11.55 ms: an interval from 12 ms is beyond it
    slower = _measured(_timed(13.0, 12.0, 14.0), profile={"MatMul": 8.5, "Gelu": 1.2, "Erf": 1.5})
    [overrun], _ = overruns(slower, None, None, base, 0.1)
    assert (overrun.metric, overrun.measured, overrun.baseline) == ("latency", 13.0, 10.0)
    assert [op for op, _ in overrun.grew] == ["MatMul", "Erf", "Gelu"]
    assert "1.30x" in overrun.message and "MatMul +2.5 ms" in overrun.message

    # a median 20% slower whose interval reaches back to the allowed one: not decided, said
    found, notes = overruns(_measured(_timed(12.0, 11.0, 13.0)), None, None, base, 0.1)
    assert found == [] and "do not say it is slower" in notes[0]

    # itself, and another machine's thread count said
    found, notes = overruns(_measured(_timed(10.2, 9.7, 10.6)), None, None, {**base, "threads": 4}, 0.1)
    assert found == [] and notes == ["baseline: measured with threads 4, this run with 2"]

    found, _ = overruns(_measured(_timed(10.0, 9.5, 10.5), peak=115.0), None, None, base, 0.1)
    assert [(o.metric, o.baseline) for o in found] == [("peak memory", 100.0)]


def test_over_budget_is_exit_5_with_a_junit_case_per_budget(dynamic_onnx, tmp_path, cli):
    """A batch takes more than a nanosecond and the worker holds more than 1 MB, wherever it runs."""
    result = cli("measure", str(dynamic_onnx), "--measure-seconds", "0.05", "--max-latency", "0.000001",
                 "--max-memory", "1", "--report", "r.json", "--junit", "r.xml")

    assert result.returncode == 5, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert {(f["kind"], f["data"]["metric"]) for f in report["failures"]} == {("budget", "latency"),
                                                                              ("budget", "peak memory")}
    assert "[budget] latency" in result.stderr and "is over the budget of 1e-06 ms" in result.stderr
    from junitparser import JUnitXml

    [suite] = list(JUnitXml.fromfile(str(tmp_path / "r.xml")))
    cases = {(case.classname, case.name): case for case in suite}
    assert not cases[("measure", "latency")].is_passed and not cases[("measure", "peak memory")].is_passed


def test_a_baseline_far_faster_is_a_regression_naming_the_op_types_that_grew(dynamic_onnx, tmp_path, cli):
    assert cli("measure", str(dynamic_onnx), "--measure-seconds", "0.2", "--report", "base.json").returncode == 0
    base = json.loads((tmp_path / "base.json").read_text())
    assert set(base["measurement"]["profile"]) == {"MatMul", "Gelu"}  # onnxruntime's profiler, by op type

    faster = json.loads(json.dumps(base))
    for timing in faster["measurement"]["timings"]:
        timing.update(median_ms=1e-6, low_ms=1e-6, high_ms=1e-6)
    faster["measurement"]["profile"] = {}
    (tmp_path / "faster.json").write_text(json.dumps(faster))
    slower = cli("measure", str(dynamic_onnx), "--measure-seconds", "0.2", "--baseline", "faster.json", "--json")
    assert slower.returncode == 5, slower.stderr
    [finding] = json.loads(slower.stdout)["failures"]
    assert finding["data"]["metric"] == "latency" and set(finding["data"]["grew"]) == {"MatMul", "Gelu"}

    missing = cli("measure", str(dynamic_onnx), "--baseline", str(dynamic_onnx))
    assert missing.returncode == 2 and "give the --report of a run with --measure" in missing.stderr


def test_rounds_pool_their_runs_and_span_their_medians():
    """Runs of two workers, one twice as fast: the pooled median lies between theirs, and its
    interval is their medians' range, however narrow each worker's own."""
    from verifiers.measurement import Measurement, Timing, pooled

    def worker(ms: float, peak: float) -> Measurement:
        return Measurement("onnxruntime", 1, 2, 0.1, 50.0, peak, (0.5, 0.5),
                           [Timing.of("default", 2, [ms, ms * 1.01, ms * 0.99] * 5)], None, {"Gemm": ms})

    both = pooled([worker(1.0, 80.0), worker(2.0, 90.0)])
    [timing] = both.timings
    assert timing.runs == 30 and (timing.low_ms, timing.high_ms) == (1.0, 2.0)
    assert 1.0 <= timing.median_ms <= 2.0 and both.peak_rss_mb == 90.0 and both.profile == {"Gemm": 1.5}


def _mlp_onnx(path, hidden: int, input_name: str = "x"):
    """x[batch, 64] -> MatMul -> Gelu -> MatMul -> y[batch, 64], the hidden layer `hidden` wide."""
    rng = np.random.default_rng(0)
    weights = [helper.make_tensor(name, TensorProto.FLOAT, shape, rng.standard_normal(shape).astype(np.float32))
               for name, shape in (("w1", [64, hidden]), ("w2", [hidden, 64]))]
    graph = helper.make_graph(
        [helper.make_node("MatMul", [input_name, "w1"], ["h"]), helper.make_node("Gelu", ["h"], ["g"]),
         helper.make_node("MatMul", ["g", "w2"], ["y"])], "mlp",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))
    return path


def test_a_baseline_artifact_is_measured_in_turn_and_a_slower_artifact_fails_against_it(tmp_path):
    """The previous release's artifact measured in the same run: the same file is no regression; one
    whose hidden layer is 32 times wider is, naming MatMul among the op types that grew."""
    small = _mlp_onnx(tmp_path / "small.onnx", 64)
    same = tmp_path / "same.onnx"
    same.write_bytes(small.read_bytes())

    even = api.measure(same, baseline_artifact=str(small), measure_seconds=0.3)
    assert even.exit_code == 0, even.summary_lines()
    against = even.measurement["baseline_artifact"]
    assert against["path"] == str(small)
    assert [(t["variant"], t["batch"]) for t in against["timings"]] == [
        (t["variant"], t["batch"]) for t in even.measurement["timings"]]
    assert all(t["runs"] >= ROUNDS * MIN_RUNS for t in (*against["timings"], *even.measurement["timings"]))
    assert any(line.startswith(f"    baseline artifact {small}") for line in even.summary_lines())

    wide = api.measure(_mlp_onnx(tmp_path / "wide.onnx", 2048), baseline_artifact=str(small), measure_seconds=0.3)
    assert wide.exit_code == 5, wide.summary_lines()
    [finding] = wide.failures
    assert finding.kind == "budget" and finding.data["metric"] == "latency"
    assert finding.data["baseline"] == against_median(wide) and "MatMul" in finding.data["grew"]


def against_median(report) -> float:
    first = report.measurement["timings"][0]
    return next(t["median_ms"] for t in report.measurement["baseline_artifact"]["timings"]
                if (t["variant"], t["batch"]) == (first["variant"], first["batch"]))


def test_a_baseline_artifact_of_other_inputs_or_beside_a_baseline_report_is_bad_input(tmp_path):
    small = _mlp_onnx(tmp_path / "small.onnx", 64)
    other = _mlp_onnx(tmp_path / "other.onnx", 64, input_name="pixels")

    renamed = api.measure(small, baseline_artifact=str(other), measure_seconds=0.05)
    assert renamed.exit_code == 2 and "other.onnx: its inputs are pixels, not x" in renamed.failures[0].message
    both = api.measure(small, baseline_artifact=str(small), baseline=str(tmp_path / "r.json"))
    assert both.exit_code == 2 and "give one" in both.failures[0].message
    missing = api.measure(small, baseline_artifact=str(tmp_path / "gone.onnx"))
    assert missing.exit_code == 2 and missing.failures[0].message.startswith("--baseline-artifact: ")


def test_gelu_forms_are_measured_in_turn_with_an_artifact_torch_exported(shared_artifact, tmp_path):
    """torch.onnx's exact GELU at opset 20 is a Gelu op: measured beside it, its decomposition into
    the erf chain and ReLU (the yardstick that is no GELU); at opset 17 (the erf chain) no Gelu op
    can be written, which is said."""
    from fixtures.specs import torch_model

    fused = shared_artifact(tmp_path / "20", torch_model("mlp_exact"), "m.onnx", to="onnx", opset=20)
    report = api.measure(fused, gelu_forms=True, measure_seconds=0.3)
    assert report.exit_code == 0, report.summary_lines()
    forms = report.measurement["gelu_forms"]
    assert [(f["form"], f["keeps_flavour"]) for f in forms] == [("primitives (Gelu ops decomposed)", True),
                                                                 ("ReLU (not GELU: the activation's own cost)", False)]
    assert all(t["runs"] >= ROUNDS * MIN_RUNS for form in forms for t in form["timings"])
    assert any(line.startswith("      primitives (Gelu ops decomposed): median ") for line in report.summary_lines())

    chain = shared_artifact(tmp_path / "17", torch_model("mlp_exact"), "m.onnx", to="onnx", opset=17)
    report = api.measure(chain, gelu_forms=True, measure_seconds=0.1)
    assert [f["form"] for f in report.measurement["gelu_forms"]] == ["ReLU (not GELU: the activation's own cost)"]
    assert any("Gelu ops need opset 20, the artifact is at opset 17" in note for note in report.notes)


def test_gelu_forms_of_a_tflite_builtin_gelu_lower_it(shared_artifact, tmp_path):
    """TFLiteConverter writes Keras's GELU as the builtin: measured beside it, the builtin lowered
    to primitives and, as the yardstick, to RELU."""
    from fixtures.specs import keras_model

    artifact = shared_artifact(tmp_path, keras_model("functional_activation"), "m.tflite", to="tflite")
    report = api.measure(artifact, gelu_forms=True, measure_seconds=0.1)
    assert report.exit_code == 0, report.summary_lines()
    forms = report.measurement["gelu_forms"]
    assert [(f["form"], f["keeps_flavour"]) for f in forms] == [("primitives (GELU builtins lowered)", True),
                                                                 ("ReLU (not GELU: the activation's own cost)", False)]
    assert all({t["variant"] for t in f["timings"]} == {t["variant"] for t in report.measurement["timings"]}
               for f in forms)


def test_the_jobs_summary_tables_each_jobs_latency_and_peak_memory(tmp_path):
    """`merge` and `run` write their Markdown summary from the job reports read back from JSON."""
    from verifiers.report import Report
    from verifiers.writers.markdown_summary import write_jobs

    measured = Report(command="verify", measurement=_measured(_timed(12.34, 11.9, 12.8, batch=4), peak=812.4))
    read_back = Report.from_dict(json.loads(json.dumps(measured.to_dict())))
    write_jobs([("bert/onnx", read_back), ("mlp/onnx", Report(command="verify"))], tmp_path / "s.md")

    rows = [line for line in (tmp_path / "s.md").read_text().splitlines() if line.startswith("| ")]
    assert rows[0].endswith("| latency | peak memory |")
    assert rows[1].endswith("| 12.3 ms [11.9, 12.8], batch 4 | 812 MB |")
    assert rows[2].endswith("|  |  |")


def test_a_measurement_asked_of_an_export_that_is_not_verified_is_said_not_made(tmp_path):
    report = api.export(MLP, to="onnx", opset=17, out=tmp_path / "mlp.onnx", verify=False, max_latency=5.0)

    assert report.exit_code == 0 and report.measurement == {}
    assert "not measured: an artifact is measured once verified, and --no-verify skips it" in report.notes


def test_the_html_report_shows_the_cost_with_the_time_by_op_type(tmp_path):
    from verifiers.report import Report
    from verifiers.writers.html_report import write

    write(Report(command="measure", measurement=_measured(_timed(12.34, 11.9, 12.8, batch=4), peak=812.4,
                                                          profile={"Gemm": 9.0, "Gelu": 1.0})), tmp_path / "r.html")

    page = (tmp_path / "r.html").read_text()
    assert "<h3>Cost</h3>" in page and "812 MB" in page and "[11.9, 12.8]" in page
    assert "<td>Gemm</td><td>9</td><td>90%</td>" in page
