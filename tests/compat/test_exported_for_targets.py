"""Artifacts exported with --target run in that target's real runtime and match the source."""

import numpy as np
import pytest
from runtime_venvs import ORT_1_16, TFLITE_2_7, Unavailable, run_model, runtime_venv

from exporter import api
from exporter.frameworks import load_source
from exporter.sources import make_batches
from fixtures.specs import keras_model, torch_model
from tests.conftest import tool_missing
from verifiers.target_facts import version_greater
from verifiers.tflite_model import load_tflite


def venv_of(spec):
    try:
        return runtime_venv(spec)
    except Unavailable as exc:
        tool_missing(f"{spec.describe()} cannot be had here: {exc}")


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mlp_exact", "block_tanh"])
def test_onnx_exported_for_ort_1_16_runs_in_onnxruntime_1_16_3(tmp_path, model):
    import fixtures.models.torch_models as models

    report = api.export(torch_model(model), to="onnx", target="ort-1.16", out=tmp_path / "m.onnx")
    assert report.exit_code == 0, report.summary_lines()
    assert report.actual_opset == 19 and report.target_checks == []
    module, (x,) = getattr(models, model)()
    result = run_model(venv_of(ORT_1_16), "onnx", tmp_path / "m.onnx", [x.numpy()])
    assert result.ok, str(result)
    np.testing.assert_allclose(result.outputs[0], module(x).detach().numpy(), atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["tflite-2.7", "tflite-2.8"])
@pytest.mark.parametrize("spec", [keras_model("functional_activation"), keras_model("functional_ops"),
                                  torch_model("mlp_tanh")], ids=lambda s: s.rsplit(":", 1)[-1])
def test_tflite_exported_for_old_targets_has_no_gelu_builtin_and_runs_in_2_7(tmp_path, spec, target):
    out = tmp_path / "m.tflite"
    report = api.export(spec, to="tflite", target=target, out=out)
    assert report.exit_code == 0, report.summary_lines()
    assert [g["status"] for g in report.gelu] == ["kept"]  # flavour kept, measured
    ops = {code.name for code in load_tflite(out).opcodes}
    assert "GELU" not in ops and "SIGN" not in ops
    assert version_greater("2.9.0", report.min_runtime_version)
    source = load_source(spec)
    feed = make_batches(source, seed=1, count=1)[-1]
    _, _, expected = source.run(feed)
    result = run_model(venv_of(TFLITE_2_7), "tflite", out, list(feed.values()))
    assert result.ok, str(result)
    np.testing.assert_allclose(result.outputs[0], expected[0], atol=1e-5, rtol=0)
