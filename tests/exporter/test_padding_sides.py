"""Without --data, a padding mask is fed as real inputs pad: on the side the folder's tokenizer pads,
on both sides where the folder has no tokenizer to say. The broken case is onnxruntime's own
transformer optimizer, whose fused Attention reads a 2-D mask as each row's length (summed by its
EmbedLayerNormalization): right for right-padded rows only."""

import json
import shutil

import onnx
import pytest

from exporter import api
from exporter.frameworks import load_source


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """transformers' BertForSequenceClassification saved without a tokenizer (its attention
    `eager`, the graph the optimizer's fusions match), exported to ONNX, and that artifact as
    onnxruntime.transformers' optimizer fuses it."""
    from onnxruntime.transformers.optimizer import optimize_model

    from fixtures.models.hf_folders import save_folder

    root = tmp_path_factory.mktemp("bert")
    folder = save_folder("bert-text-classification", root / "folder")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "attn_implementation": "eager"}))
    report = api.export(str(folder), to="onnx", opset=17, out=root / "bert.onnx")
    assert report.exit_code == 0, report.summary_lines()  # both sides fed: the exporter's graph holds on each
    optimized = optimize_model(str(root / "bert.onnx"), model_type="bert", num_heads=2, hidden_size=32)
    optimized.save_model_to_file(str(root / "fused.onnx"))
    return folder, root / "fused.onnx"


def _with_tokenizer(folder, destination, padding_side):
    from transformers import BertTokenizerFast

    shutil.copytree(folder, destination)
    vocab = destination / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(95))]))
    BertTokenizerFast(str(vocab), padding_side=padding_side).save_pretrained(str(destination))
    return destination


def test_a_fused_attention_reading_the_mask_as_lengths_fails_on_left_padded_rows(bert):
    folder, fused = bert
    nodes = onnx.load(str(fused)).graph.node
    [embedding] = [node for node in nodes if node.op_type == "EmbedLayerNormalization"]
    attentions = [node for node in nodes if node.op_type == "Attention"]
    # Each Attention reads its mask as the row lengths EmbedLayerNormalization sums from it.
    assert attentions and all(node.input[3] == embedding.output[1] for node in attentions)

    report = api.verify(fused, source=str(folder))

    assert report.exit_code == 1, report.summary_lines()
    assert report.failures[0].output == "logits"
    assert report.divergence["first"]["op_type"] == "Attention", report.divergence


def test_a_tokenizer_that_pads_on_the_right_is_fed_right_padded_rows_only(bert, tmp_path):
    folder, fused = bert
    right = _with_tokenizer(folder, tmp_path / "right", "right")

    report = api.verify(fused, source=str(right))

    assert report.exit_code == 0, report.summary_lines()


def test_the_examples_mask_is_padded_on_the_tokenizers_side_or_on_both(bert, tmp_path):
    folder, _ = bert
    both = load_source(str(folder)).example["attention_mask"]
    left = load_source(str(_with_tokenizer(folder, tmp_path / "left", "left"))).example["attention_mask"]

    assert both[0, 0] == 0 and both[0, -1] == 1  # one row padded on the left
    assert both[1, 0] == 1 and both[1, -1] == 0  # one on the right
    assert left[-1, 0] == 0 and left[-1, -1] == 1 and left[:-1].all()
