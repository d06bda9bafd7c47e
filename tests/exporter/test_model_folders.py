"""transformers model folders as MODEL (docs/guides/transformers-folders.md): what a folder may do
is checked before transformers reads it, the task is inferred from config.architectures, and the
loaded model takes the task's inputs with its symbolic axes.

Folders are saved with `save_pretrained` from tiny seeded models (fixtures/models/hf_folders.py);
the hostile ones are those folders edited. Real transformers throughout.
"""

import json
import shutil

import numpy as np
import pytest
import torch

from exporter.frameworks import load_source
from exporter.model_folders import read_folder
from exporter.sources import parse_input_spec
from fixtures.models.hf_folders import FOLDERS, save_folder
from verifiers.errors import BadInput, Incompatible
from verifiers.report import EXIT_CODES


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every folder of FOLDERS, saved once."""
    root = tmp_path_factory.mktemp("folders")
    return {name: save_folder(name, root / name) for name in FOLDERS}


@pytest.fixture
def bert(saved, tmp_path):
    """A copy of the BERT classifier's folder this test may edit."""
    return shutil.copytree(saved["bert-text-classification"], tmp_path / "bert")


def _edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("name", [name for name, spec in FOLDERS.items() if not spec.ambiguous])
def test_the_task_is_inferred_from_the_saved_architecture(saved, name):
    folder = read_folder(saved[name], None, trust=False)
    assert (folder.model_type, folder.task.name) == (FOLDERS[name].model_type, FOLDERS[name].task)
    assert folder.weights == (saved[name] / "model.safetensors",)


def test_a_head_of_several_tasks_lists_them_and_the_task_given_is_taken(saved):
    # BartForConditionalGeneration is both BART's masked-LM and its text2text head in transformers
    with pytest.raises(BadInput, match="its architecture BartForConditionalGeneration does not tell one task; "
                                       "give --task, one of: .*fill-mask.*text2text-generation, "
                                       "text2text-generation-encoder, text2text-generation-with-past"):
        read_folder(saved["bart-text2text-generation"], None, trust=False)
    assert read_folder(saved["bart-text2text-generation"], "text2text-generation", trust=False).task.name == \
        "text2text-generation"


def test_a_model_type_without_the_tasks_head_is_incompatible(saved):
    with pytest.raises(Incompatible, match="model type vit has no fill-mask head") as caught:
        read_folder(saved["vit-image-classification"], "fill-mask", trust=False)
    assert EXIT_CODES[caught.value.kind] == 4


def test_an_architecture_of_no_task_lists_the_model_types_tasks(bert):
    _edit_config(bert, architectures=["BertForPreTraining"])
    with pytest.raises(BadInput, match="BertForPreTraining does not tell one task; give --task, one of: "
                                       "feature-extraction, fill-mask, text-classification") as caught:
        read_folder(bert, None, trust=False)
    assert EXIT_CODES[caught.value.kind] == 2


def test_an_unknown_task_is_bad_input(bert):
    with pytest.raises(BadInput, match="--task summarize: unknown task"):
        read_folder(bert, "summarize", trust=False)


@pytest.mark.parametrize("config, message", [
    ("{not json", "config.json does not load"),
    ('{"architectures": ["BertModel"]}', "names no model_type"),
    ('{"model_type": "bert", "auto_map": {"AutoModel": "modeling.Model"}}', "brings its own code"),
])
def test_configs_that_do_not_load_or_bring_code_are_refused(bert, config, message):
    (bert / "config.json").write_text(config)
    with pytest.raises(BadInput, match=message):
        read_folder(bert, None, trust=False)


def test_pickled_weights_load_only_with_trust_source(bert):
    model = torch.nn.Linear(1, 1)
    (bert / "model.safetensors").unlink()
    torch.save(model.state_dict(), bert / "pytorch_model.bin")
    with pytest.raises(BadInput, match=r"its weights are pickles \(pytorch_model.bin\).*--trust-source"):
        read_folder(bert, None, trust=False)
    assert read_folder(bert, None, trust=True).pickled


def test_missing_weights_are_bad_input(bert):
    (bert / "model.safetensors").unlink()
    with pytest.raises(BadInput, match="no weights"):
        read_folder(bert, None, trust=False)


@pytest.mark.parametrize("shard, message", [
    ("../elsewhere.safetensors", "names a shard outside the folder"),
    ("/etc/passwd", "names a shard outside the folder"),
    ("model-00002-of-00002.safetensors", "names a shard that is missing"),
])
def test_a_shard_index_may_name_only_files_inside_the_folder(bert, shard, message):
    (bert / "model.safetensors").rename(bert / "model-00001-of-00002.safetensors")
    (bert / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": shard}}))
    with pytest.raises(BadInput, match=message):
        read_folder(bert, None, trust=False)


def test_a_sharded_folder_lists_every_shard(saved, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(saved["llama-causal-lm"])
    model.save_pretrained(tmp_path / "sharded", max_shard_size="10KB")
    folder = read_folder(tmp_path / "sharded", None, trust=False)
    assert len(folder.weights) > 1
    assert {p.name for p in folder.weights} == set(json.loads(
        (tmp_path / "sharded" / "model.safetensors.index.json").read_text())["weight_map"].values())


@pytest.mark.parametrize("name, inputs, dynamic", [
    ("bert-text-classification", ["input_ids", "attention_mask", "token_type_ids"],
     {"batch_size", "sequence_length"}),
    ("distilbert-question-answering", ["input_ids", "attention_mask"], {"batch_size", "sequence_length"}),
    ("bert-multiple-choice", ["input_ids", "attention_mask", "token_type_ids"],
     {"batch_size", "num_choices", "sequence_length"}),
    ("vit-image-classification", ["pixel_values"], {"batch_size"}),
    ("t5-text2text-generation", ["input_ids", "attention_mask", "decoder_input_ids"],
     {"batch_size", "sequence_length", "decoder_sequence_length"}),
])
def test_the_loaded_model_takes_the_tasks_inputs_and_returns_its_outputs(saved, name, inputs, dynamic):
    source = load_source(str(saved[name]))
    assert source.input_names == inputs
    assert {axis.symbol for axis in source.dynamic} == dynamic
    assert source.facts == {"model_type": FOLDERS[name].model_type, "task": FOLDERS[name].task}
    names, _, outputs = source.run(source.example)
    head = read_folder(saved[name], None, trust=False).task
    assert names == list(head.outputs)
    # the same numbers as the head transformers loads, called as transformers documents it
    import transformers

    reference = getattr(transformers, FOLDERS[name].head).from_pretrained(saved[name]).eval()
    with torch.no_grad():
        expected = reference(**{k: torch.from_numpy(v) for k, v in source.example.items()})
    for name_, got in zip(names, outputs):
        np.testing.assert_allclose(got, expected[name_].numpy(), atol=1e-6)


def test_the_example_has_padding_and_token_ids_within_the_vocabulary(saved):
    source = load_source(str(saved["bert-text-classification"]))
    ids, mask = source.example["input_ids"], source.example["attention_mask"]
    assert ids.max() < 100 and ids.dtype == np.int64
    assert not mask.all() and mask.any(axis=-1).all()  # padding, and no row without a position to attend to


def test_task_is_only_for_model_folders(tmp_path):
    with pytest.raises(BadInput, match="--task text-classification: applies to a transformers model folder"):
        load_source(str(tmp_path / "model.keras"), task="text-classification")


def test_tokenizer_files_are_found_and_links_are_not(bert, tmp_path):
    (bert / "tokenizer.json").write_text("{}")
    (tmp_path / "secret").write_text("not the model's")
    (bert / "vocab.txt").symlink_to(tmp_path / "secret")
    assert [p.name for p in read_folder(bert, None, trust=False).processing] == ["tokenizer.json"]


def test_input_sizes_given_for_a_folder_are_the_sizes_fed(saved, tmp_path):
    """--input on a source that brings example inputs is honoured, never dropped: the given input
    takes its shape and range, the inputs sharing its symbols follow, and the report says what ran."""
    from exporter import api

    folder = str(saved["bert-text-classification"])
    exported = tmp_path / "bert.onnx"
    assert api.export(folder, to="onnx", opset=17, out=exported).exit_code == 0
    report = api.verify(exported, source=folder, inputs=["input_ids:4x24:int64:5..50"], batches=1)
    assert report.exit_code == 0, report.summary_lines()
    for batch in report.feeds:
        fed = batch["inputs"]
        assert {name: value["shape"] for name, value in fed.items()} == {
            "input_ids": [4, 24], "attention_mask": [4, 24], "token_type_ids": [4, 24]}
        assert 5 <= fed["input_ids"]["min"] and fed["input_ids"]["max"] < 50
    assert [batch["origin"] for batch in report.feeds] == [
        "the source's example inputs made anew at the --input sizes (seed 0)", "seeded random (seed 0)"]
    with pytest.raises(BadInput, match="takes input_ids as int64"):
        load_source(folder, [parse_input_spec("input_ids:4x24:int32")])
    with pytest.raises(BadInput, match="makes sequence_length 24"):
        load_source(folder, [parse_input_spec("input_ids:4x24:int64"), parse_input_spec("attention_mask:4x9:int64")])


def test_a_decoder_exported_without_its_cache_is_verified_with_the_task_named(saved, tmp_path):
    """GPT-2's config infers text-generation-with-past; an artifact exported for text-generation
    takes no cache, and verify says which --task fits it."""
    from exporter import api

    folder = str(saved["gpt2-causal-lm"])
    exported = tmp_path / "gpt2.onnx"
    assert api.export(folder, to="onnx", task="text-generation", out=exported).exit_code == 0
    report = api.verify(exported, source=folder)
    assert report.exit_code == 2
    assert report.failures[0].message.endswith("give --task text-generation"), report.failures[0].message
    assert api.verify(exported, source=folder, task="text-generation").exit_code == 0


def test_a_decoder_the_llm_route_cannot_export_is_one_exit_4_saying_what_can(saved, tmp_path):
    """GPT-2 with its cache to TFLite: what export_hf's cache reads of the config is checked before
    its tokenizer, so a folder without one still gets the reason that holds, and what to do."""
    from exporter import api

    folder = shutil.copytree(saved["gpt2-causal-lm"], tmp_path / "gpt2")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink(missing_ok=True)
    report = api.export(str(folder), to="tflite", out=tmp_path / "gpt2.tflite")
    assert report.exit_code == 4
    (finding,) = report.failures
    assert "num_key_value_heads" in finding.message and "tokenizer" not in finding.message
    assert finding.message.endswith("export for --task text-generation (no cache, fixed sizes) or --to onnx")
