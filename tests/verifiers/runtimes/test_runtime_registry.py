"""Runtimes are found by name: a second ONNX runtime registered beside onnxruntime runs an artifact
(its batches, its GELU probes, its GELU-swapped variant) when `verify --runtime` names it, and
onnxruntime stays the default."""

import json

import pytest

from exporter import api
from fixtures.specs import torch_model
from verifiers.errors import BadInput
from verifiers.runtimes import RUNTIMES, runtime_for
from verifiers.runtimes.onnxruntime_runner import OnnxRuntimeRunner

PLUGIN = "counting-onnxruntime = fixtures.runners:CountingOnnxRuntime\n"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("exported") / "m.onnx"
    assert api.export(torch_model("mlp_exact"), to="onnx", opset=17, out=out).exit_code == 0
    return out


@pytest.fixture
def plugin_path(tmp_path):
    """A folder holding an installed distribution that declares the wrapper under the
    "exportgate.runtimes" entry-point group, as a runtime plug-in would."""
    dist = tmp_path / "plugins" / "exportgate_counting_runtime-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: exportgate-counting-runtime\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[exportgate.runtimes]\n" + PLUGIN)
    return dist.parent


def test_verify_runtime_runs_the_artifact_in_the_named_runtime(cli, tmp_path, exported, plugin_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    counted = {"EXPORTGATE_TEST_RUNS": str(runs)}
    prelude = f"import sys; sys.path.insert(0, {str(plugin_path)!r})"
    named = cli("verify", exported, "--source", torch_model("mlp_exact"), "--runtime", "counting-onnxruntime",
                "--report", "named.json", prelude=prelude, env=counted)
    assert named.returncode == 0, named.stderr
    report = json.loads((tmp_path / "named.json").read_text())
    assert report["runtime"] == "counting-onnxruntime" and report["verdict"] == "pass"
    batches = report["batches"] + report["example_batch"]
    # The comparison's batches, one probe run per GELU site and the GELU-swapped variant's one
    # batch all ran in the wrapper.
    assert len(report["gelu"]) == 1
    assert len(list(runs.iterdir())) == batches + 1 + 1

    for leftover in runs.iterdir():
        leftover.unlink()
    default = cli("verify", exported, "--source", torch_model("mlp_exact"), "--report", "default.json",
                  prelude=prelude, env=counted)
    assert default.returncode == 0, default.stderr
    assert json.loads((tmp_path / "default.json").read_text())["runtime"] == "onnxruntime"
    assert list(runs.iterdir()) == []


def test_registered_in_process_and_refused_for_another_format():
    RUNTIMES.register("counting-onnxruntime", "fixtures.runners:CountingOnnxRuntime")
    try:
        assert runtime_for("onnx") is OnnxRuntimeRunner
        assert runtime_for("onnx", "counting-onnxruntime").__name__ == "CountingOnnxRuntime"
        with pytest.raises(BadInput, match=r"--runtime counting-onnxruntime: runs onnx artifacts, not tflite"):
            runtime_for("tflite", "counting-onnxruntime")
    finally:
        RUNTIMES.unregister("counting-onnxruntime")
    with pytest.raises(BadInput, match=r"--runtime tensorrt: unknown runtime \(known: onnxruntime, ai-edge-litert, openvino"):
        runtime_for("onnx", "tensorrt")
