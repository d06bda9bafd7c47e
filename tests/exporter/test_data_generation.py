"""--data on a decoder exported with past: the data's lines are prompts, put through the folder's
own GPT-2 tokenizer (byte-level BPE, no pad token: GPT-2's), left-padded, and the artifact
generates on them as transformers' generate does. The oracles are transformers' tokenizer and
generate, called here, and onnx's own reading of the artifact."""

import numpy as np
import onnx.numpy_helper
import pytest

from exporter import api

PROMPTS = ["the zebra eats grass", "a cat", "the dog runs after the cat in the park", "zebra stripes",
           "birds sing"]
CORPUS = ["the cat sat on the mat", "a dog runs in the park", "birds sing in the trees", "the zebra has stripes",
          "zebra zebra zebra grass"] * 20


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """transformers' GPT2LMHeadModel (its input and output embeddings apart) saved with a
    GPT2TokenizerFast trained by `tokenizers` on a small corpus, exported with past to ONNX on the
    prompts."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast

    from fixtures.models.hf_folders import FOLDERS, FolderSpec, save_folder

    root = tmp_path_factory.mktemp("gpt2")
    trained = ByteLevelBPETokenizer()
    trained.train_from_iterator(CORPUS, vocab_size=300, special_tokens=["<|endoftext|>"])
    trained.save_model(str(root))
    tokenizer = GPT2TokenizerFast(str(root / "vocab.json"), str(root / "merges.txt"))
    spec = FOLDERS["gpt2-causal-lm"]
    end = tokenizer.eos_token_id
    config = {**spec.config, "vocab_size": len(tokenizer), "tie_word_embeddings": False, "bos_token_id": end,
              "eos_token_id": end}
    folder = save_folder(FolderSpec(spec.model_type, spec.head, spec.task, config), root / "folder")
    tokenizer.save_pretrained(str(folder))
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    report = api.export(str(folder), to="onnx", opset=17, out=root / "gpt2.onnx", data=str(prompts))
    return folder, prompts, root / "gpt2.onnx", report


def test_a_gpt2_with_past_generates_on_the_datas_prompts_as_transformers_does(gpt2):
    from transformers import AutoTokenizer

    folder, prompts, _, report = gpt2

    assert report.exit_code == 0, report.summary_lines()
    assert report.task == "text-generation-with-past"
    generation = report.generation
    assert generation["prompts"] == len(PROMPTS)
    assert generation["decode_steps"] >= 3
    for step in generation["steps"]:
        assert step["samples"] == len(PROMPTS) and not step["tokens_differ"], step
    # The prompts went through the folder's tokenizer, padded on the left; GPT-2 has no pad token.
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer.pad_token is None
    assert report.data["padding"]["side"] == "left"
    assert tokenizer.eos_token in report.data["padding"]["pad_token"]
    batch = report.data["batch_size"]
    lengths = {max(len(tokenizer(p)["input_ids"]) for p in PROMPTS[k:k + batch]) for k in range(0, len(PROMPTS), batch)}
    assert {shape["input_ids"][1] for shape in report.data["shapes"]} == lengths
    # Every step's logits counted per prompt: greedy-token agreement at every position.
    [logits] = report.data["outputs"]
    assert logits["name"] == "logits" and logits["samples"] == len(PROMPTS)
    assert logits["top1"]["worst"] == 1.0 and logits["samples_out_of_tolerance"] == 0


def test_an_embedding_row_only_a_prompt_uses_fails_on_the_data_naming_that_prompt(gpt2, tmp_path):
    """The artifact's input embedding changed in the rows of a word only prompt 3 holds: the
    seeded prompts pass, the data's generate names sample 3 at the prefill."""
    from transformers import AutoTokenizer

    folder, prompts, artifact, _ = gpt2
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    ids = [set(tokenizer(p)["input_ids"]) for p in PROMPTS]
    only_third = sorted(ids[3] - set().union(*ids[:3], *ids[4:]))
    assert only_third, ids
    model = onnx.load(str(artifact))
    gathered = {node.input[0] for node in model.graph.node if node.op_type == "Gather"}
    [table] = [t for t in model.graph.initializer if t.name in gathered and list(t.dims) == [len(tokenizer), 32]]
    weights = onnx.numpy_helper.to_array(table).copy()
    weights[only_third] += np.random.default_rng(3).normal(0, 2.0, weights[only_third].shape)
    table.CopyFrom(onnx.numpy_helper.from_array(weights, table.name))
    onnx.save(model, str(tmp_path / "changed.onnx"))

    assert api.verify(tmp_path / "changed.onnx", source=str(folder)).exit_code == 0  # the seeded prompts

    report = api.verify(tmp_path / "changed.onnx", source=str(folder), data=str(prompts))

    assert report.exit_code == 1, report.summary_lines()
    prefill = [f for f in report.failures if f.data.get("generate_step") == 0]
    assert prefill and {f.data["sample"] for f in prefill} == {3}, [f.message for f in report.failures]
    assert any("sample 3" in f.message for f in prefill)
    [logits] = report.data["outputs"]
    assert logits["max_abs"]["worst_sample"] == 3
