"""Tiny transformers models (built from configs): keyword-heavy forward() signatures and the GELU
spellings of real models (nn.GELU in BERT, gelu_new in GPT-2, quick_gelu in CLIP)."""

import pytest

from exporter import api
from fixtures.specs import MODELS

HF_MODELS = MODELS / "hf_models.py"


@pytest.mark.parametrize("model, opset, exporter, source_op, flavour", [
    ("bert", 14, "torch.onnx (torchscript)", "aten.gelu", "exact"),
    ("bert", 18, "torch.onnx (dynamo)", "aten.gelu", "exact"),
    pytest.param("gpt2", 18, "torch.onnx (dynamo)", "tanh-chain", "tanh", marks=pytest.mark.slow),  # 20 by default
    ("gpt2", 20, "torch.onnx (dynamo)", "tanh-chain", "tanh"),
    ("clip_text", 17, "torch.onnx (torchscript)", "sigmoid-chain", "quick"),
])
def test_export_verify_and_guard(tmp_path, model, opset, exporter, source_op, flavour):
    report = api.export(f"{HF_MODELS}:{model}", to="onnx", opset=opset, out=tmp_path / "m.onnx")
    assert report.exit_code == 0, report.summary_lines()
    assert report.exporter == exporter  # for BERT the TorchScript exporter works: inputs go by keyword
    assert len(report.gelu) == 2  # one GELU per layer
    assert {(g["status"], g["source_op"], g["source_flavour"]) for g in report.gelu} == {("kept", source_op, flavour)}


@pytest.mark.parametrize(("model", "opset"), [("bert", 13), ("gpt2", 13), ("gpt2", 17)])
def test_low_opsets_export_through_the_torchscript_exporter(tmp_path, model, opset):
    # torch has scaled_dot_product_attention only from opset 14 and no aten::diff; transformers'
    # masks cumsum bools, which the exporter writes as a CumSum onnx.checker rejects.
    report = api.export(f"{HF_MODELS}:{model}", to="onnx", opset=opset, out=tmp_path / "m.onnx")
    assert report.exit_code == 0, report.summary_lines()
    assert (report.exporter, report.actual_opset) == ("torch.onnx (torchscript)", opset)
    assert [g["status"] for g in report.gelu] == ["kept", "kept"]


def test_dynamo_below_18_writes_splits_the_lower_opset_reads(tmp_path):
    # dynamo's down-conversion keeps Split-18's num_outputs (GPT-2's qkv split), which onnx.checker
    # rejects at 17; the route rewrites it and the artifact verifies.
    report = api.export(f"{HF_MODELS}:gpt2", to="onnx", opset=17, exporter="dynamo", out=tmp_path / "m.onnx")
    assert report.exit_code == 0, report.summary_lines()
    assert (report.exporter, report.actual_opset) == ("torch.onnx (dynamo)", 17)
    assert [g["status"] for g in report.gelu] == ["kept", "kept"]


def test_causal_attention_below_opset_14_is_exit_4_naming_trilu(tmp_path):
    report = api.export(f"{MODELS / 'torch_models.py'}:causal_attention", to="onnx", opset=13,
                        out=tmp_path / "m.onnx")
    assert report.exit_code == 4
    assert "is_causal=True needs Trilu (opset 14)" in report.failures[0].message
    assert "produced opset 18" in report.failures[0].message  # the dynamo exporter's fallback
