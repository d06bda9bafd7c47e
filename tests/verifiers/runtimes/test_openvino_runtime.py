"""`verify --runtime openvino`: OpenVINO's CPU plugin runs the artifact at the precision it picks on
this CPU (its documented rule: bf16 where the CPU reports BF16 among its optimization capabilities,
f32 elsewhere), the report says which, --precision-hint pins it, and a float16 artifact still runs
in float16 arithmetic. Oracles: OpenVINO's own capability list, onnxruntime's outputs on the same
feed, PyTorch's float16 overflow (tests/verifiers/test_float16_arithmetic.py)."""

import numpy as np
import onnxruntime as ort
import openvino as ov
import pytest

from exporter import api
from fixtures.models.hf_folders import save_folder
from tests.verifiers.test_float16_arithmetic import MLP, OVERFLOW, _converted
from verifiers.runtimes import isolation
from verifiers.runtimes.openvino_runner import OpenVinoRunner


def _default_precision() -> str:
    capabilities = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    return "bfloat16" if "BF16" in capabilities else "float32"


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("openvino")
    assert api.export(MLP, to="onnx", opset=17, out=folder / "mlp.onnx").exit_code == 0
    overflow, _ = _converted(OVERFLOW, folder)
    return {"mlp": folder / "mlp.onnx", "overflow": overflow}


def test_the_example_runs_as_openvino_deploys_it_and_the_report_says_at_what(artifacts):
    report = api.verify(artifacts["mlp"], source=MLP, runtime="openvino")

    assert report.exit_code == 0, report.summary_lines()
    assert report.runtime == "openvino" and report.versions.get("openvino")
    precision = _default_precision()
    assert report.arithmetic["default"].startswith(f"{precision}: OpenVINO's CPU plugin computes at ")
    assert report.arithmetic["default"].endswith("(its default on this CPU)")
    assert [g["status"] for g in report.gelu] == ["kept", "kept"]
    assert report.outputs[0].atol == (5e-2 if precision == "bfloat16" else 1e-4)


def test_pinned_to_f32_it_matches_onnxruntime_within_float32_rounding(artifacts, monkeypatch):
    from verifiers import runtimes

    session = ort.InferenceSession(str(artifacts["mlp"]), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal(session.get_inputs()[0].shape).astype(np.float32) * 3
    expected = session.run(None, {session.get_inputs()[0].name: x})[0]
    monkeypatch.setattr(runtimes, "run_precision", "f32")
    runner = OpenVinoRunner(artifacts["mlp"])
    assert runner.precision == "float32"
    np.testing.assert_allclose(runner.run({runner.inputs[0].name: x})[0], expected, rtol=1e-5, atol=1e-6)

    with isolation.limits(precision_hint="f32"):
        report = api.verify(artifacts["mlp"], source=MLP, runtime="openvino")
    assert report.exit_code == 0, report.summary_lines()
    assert report.arithmetic == {"default": "float32: OpenVINO's CPU plugin computes at f32 (--precision-hint f32)"}


def test_a_float16_artifact_that_overflows_fails_there_too_naming_the_op(artifacts):
    report = api.verify(artifacts["overflow"], source=OVERFLOW, runtime="openvino")

    assert report.exit_code == 1, report.summary_lines()
    assert report.runtime == "openvino" and set(report.arithmetic) == {"default", "float16"}
    assert report.arithmetic["float16"].startswith("float16")
    assert all(f.data.get("variant") == "float16" for f in report.failures), [f.message for f in report.failures]
    assert report.divergence["overflow"]["op_type"] == "Mul"


def test_a_transformers_bert_runs_green_in_openvino(tmp_path):
    folder = save_folder("bert-text-classification", tmp_path / "bert")
    assert api.export(str(folder), to="onnx", opset=17, out=tmp_path / "out" / "bert.onnx").exit_code == 0

    report = api.verify(tmp_path / "out" / "bert.onnx", source=str(folder), runtime="openvino")

    assert report.exit_code == 0, report.summary_lines()
    assert report.arithmetic["default"].startswith(_default_precision())
    assert report.gelu and all(g["status"] == "kept" for g in report.gelu)


@pytest.mark.parametrize(("runtime", "hint", "message"), [
    ("onnxruntime", "f32", "--precision-hint f32: onnxruntime picks none (--runtime openvino takes one)"),
    ("openvino", "f64", "--precision-hint f64: openvino takes f32, bf16, f16"),
])
def test_a_precision_hint_no_runtime_takes_is_exit_2(artifacts, runtime, hint, message):
    with isolation.limits(precision_hint=hint):
        report = api.verify(artifacts["mlp"], source=MLP, runtime=runtime)

    assert report.exit_code == 2
    assert [f.message for f in report.failures] == [message]


def test_a_faulted_artifact_is_localised_in_openvino(artifacts, tmp_path):
    """The op a fault was put in is where the divergence is found, OpenVINO running the inspections."""
    from fixtures.inject_faults import inject_onnx

    fault = inject_onnx(artifacts["mlp"], "weight_perturbed", tmp_path / "faulty.onnx")
    assert fault is not None

    report = api.verify(tmp_path / "faulty.onnx", source=MLP, runtime="openvino")

    assert report.exit_code == 1, report.summary_lines()
    assert report.divergence["first"]["index"] in fault.ops, (fault, report.divergence.get("message"))


def test_without_openvino_installed_the_error_says_what_to_install(artifacts, tmp_path, monkeypatch):
    """The worker imports what the parent's path holds first: here a package that is not there."""
    (tmp_path / "openvino").mkdir()
    (tmp_path / "openvino" / "__init__.py").write_text("raise ModuleNotFoundError('No module named openvino', name='openvino')\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    report = api.verify(artifacts["mlp"], source=MLP, runtime="openvino")

    assert report.exit_code == 2
    assert [f.message for f in report.failures] == [
        "--runtime openvino: OpenVINO is not installed here; pip install 'exportgate[openvino]'"]
