"""An artifact whose inputs are laid out differently from the source's is named as such, for every
format, before anything runs: LiteRT would resize the input and only the outputs would differ."""

import pytest

from exporter import api
from fixtures.specs import torch_model


@pytest.mark.parametrize("to", ["onnx", "tflite"])
def test_a_transposed_input_layout_is_named(tmp_path, to):
    artifact = tmp_path / f"m.{to}"
    exported = api.export(torch_model("channels_last"), to=to, out=artifact)
    assert exported.exit_code == 0, exported.summary_lines()

    report = api.verify(artifact, source=torch_model("channels_first"))
    assert report.exit_code == 2
    [finding] = report.failures
    assert finding.message == (
        "input x: the artifact takes [2, 16, 8], the source feeds [2, 8, 16] (axes 1, 2 differ); the same sizes "
        "in another order: the artifact's layout looks like the source's transposed by [0, 2, 1]")
    assert not report.outputs  # nothing ran


def test_a_dynamic_axis_takes_any_size(tmp_path):
    artifact = tmp_path / "m.onnx"
    exported = api.export(torch_model("mlp_exact"), to="onnx", opset=17, dynamic=["input:0"], out=artifact)
    assert exported.exit_code == 0, exported.summary_lines()
    assert api.verify(artifact, source=torch_model("mlp_exact")).exit_code == 0
