"""Tiny transformers models (built from configs): keyword-heavy forward() signatures and the GELU
spellings of real models (nn.GELU in BERT, gelu_new in GPT-2, quick_gelu in CLIP)."""

import pytest

from exporter import api
from fixtures.specs import MODELS

HF_MODELS = MODELS / "hf_models.py"


@pytest.mark.parametrize("model, opset, exporter, source_op, flavour", [
    ("bert", 14, "torch.onnx (torchscript)", "aten.gelu", "exact"),
    ("bert", 18, "torch.onnx (dynamo)", "aten.gelu", "exact"),
    ("gpt2", 18, "torch.onnx (dynamo)", "tanh-chain", "tanh"),
    ("gpt2", 20, "torch.onnx (dynamo)", "tanh-chain", "tanh"),
    ("clip_text", 17, "torch.onnx (torchscript)", "sigmoid-chain", "quick"),
])
def test_export_verify_and_guard(tmp_path, model, opset, exporter, source_op, flavour):
    report = api.export(f"{HF_MODELS}:{model}", to="onnx", opset=opset, out=tmp_path / "m.onnx")
    assert report.exit_code == 0, report.summary_lines()
    assert report.exporter == exporter  # for BERT the TorchScript exporter works: inputs go by keyword
    assert len(report.gelu) == 2  # one GELU per layer
    assert {(g["status"], g["source_op"], g["source_flavour"]) for g in report.gelu} == {("kept", source_op, flavour)}


def test_an_op_missing_at_the_requested_opset_is_exit_4(tmp_path):
    report = api.export(f"{HF_MODELS}:bert", to="onnx", opset=13, out=tmp_path / "m.onnx")
    assert report.exit_code == 4
    assert "scaled_dot_product_attention" in report.failures[0].message
    assert "produced opset 18" in report.failures[0].message


def test_an_exporter_artifact_that_fails_the_checker_is_exit_4(tmp_path):
    # The TorchScript exporter has no aten::diff (transformers' masking); the dynamo exporter's
    # conversion down to 17 keeps Split-18's num_outputs attribute, which onnx.checker rejects.
    report = api.export(f"{HF_MODELS}:gpt2", to="onnx", opset=17, out=tmp_path / "m.onnx")
    assert report.exit_code == 4
    assert "aten::diff" in report.notes[0]
    assert "does not load" in report.failures[0].message and "Split" in report.failures[0].message
    assert not (tmp_path / "m.onnx").exists() and (tmp_path / "m.onnx.rejected").exists()
