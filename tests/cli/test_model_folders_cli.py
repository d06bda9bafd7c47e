"""`exportgate export FOLDER` and `verify --source FOLDER` for transformers model folders
(docs/guides/transformers-folders.md): exit codes, what the report records, what is published beside the
artifact, the GELU flavours the config declares, release-pipeline jobs. The full matrix of model
types, opsets and TFLite is tests/corpus/test_model_folder_matrix.py (slow).

Folders are `save_pretrained` output of tiny seeded models (fixtures/models/hf_folders.py); the
tokenizer is a real transformers tokenizer saved beside one of them.
"""

import hashlib
import json
import shutil

import pytest

from exporter import api, runs
from fixtures.broken_caches import restart_positions, swap_presents
from fixtures.cli_in_process import run_cli_here
from fixtures.generation import tokens_agree
from fixtures.inject_faults import inject_onnx
from fixtures.models.hf_folders import save_folder
from tests.conftest import run_cli

# A folder exported by litert-torch (PyTorch's TFLite route, the slowest) is the slow suite's, as in
# tests/cli/test_contract.py; tests/exporter/routes/test_torch_tflite.py keeps the route in the default one.
litert_torch_export = pytest.mark.slow


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("folders")
    saved = {name: save_folder(name, root / name) for name in (
        "bert-text-classification", "roberta-fill-mask", "vit-image-classification", "llama-causal-lm",
        "bart-text2text-generation")}
    from transformers import BertTokenizerFast

    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(95))]))
    BertTokenizerFast(str(vocab)).save_pretrained(str(saved["bert-text-classification"]))
    return saved


@pytest.fixture(scope="module")
def bert_onnx(folders, tmp_path_factory):
    """The BERT classifier exported to ONNX at opset 17 (its report beside it)."""
    out = tmp_path_factory.mktemp("bert") / "bert.onnx"
    result = run_cli_here("export", folders["bert-text-classification"], "--to", "onnx", "--opset", "17", "--out",
                          out, "--report", out.parent / "report.json", cwd=out.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    return out, result


def _sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_folder_exports_for_its_task_verified_at_other_sizes(folders, bert_onnx):
    out, result = bert_onnx
    folder = folders["bert-text-classification"]
    report = json.loads((out.parent / "report.json").read_text())
    assert (report["model_type"], report["task"]) == ("bert", "text-classification")
    assert {(f["path"], f["sha256"]) for f in report["source_files"]} >= {
        (str(folder / name), _sha256(folder / name)) for name in ("config.json", "model.safetensors")}
    checked = {(d["input"], d["symbol"]): d for d in report["dynamic"]}
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        assert checked[name, "batch_size"]["status"] == checked[name, "sequence_length"]["status"] == "pass"
        assert len(checked[name, "sequence_length"]["sizes"]) >= 3
    assert report["gelu_configured"]["declared"] == {"hidden_act": {"name": "gelu", "flavour": "exact"}}
    assert report["gelu_configured"]["off"] == []
    # the tokenizer travels with the artifact
    assert report["published_beside"] == ["tokenizer.json", "tokenizer_config.json"]
    for name in report["published_beside"]:
        assert (out.parent / name).read_bytes() == (folder / name).read_bytes()
    assert "published beside it: tokenizer.json, tokenizer_config.json" in result.stdout + result.stderr


def _dense_bias_subtracted(path, out):
    """The artifact with the bias Add of the last layer's output Linear turned into a Sub: a Linear
    whose bias is all zeros (freshly initialised), so the MatMul before it already holds the
    Linear's value, and that bias is shared with other zero biases through an Identity node."""
    import onnx

    model = onnx.load(str(path))
    [node] = [n for n in model.graph.node if n.name.endswith("layer.1/output/dense/Add")]
    node.op_type = "Sub"
    onnx.save(model, str(out))
    return node.name


def test_the_artifact_verifies_against_its_folder(folders, bert_onnx, cli):
    out, _ = bert_onnx
    assert cli("verify", out, "--source", folders["bert-text-classification"]).returncode == 0


@pytest.mark.parametrize("fault", ["add_to_sub", "dense_bias_subtracted"])
def test_a_broken_artifact_fails_against_its_folder_naming_the_faulted_op(folders, bert_onnx, cli, tmp_path, fault):
    import onnx

    out, _ = bert_onnx
    folder = folders["bert-text-classification"]
    broken = tmp_path / "broken.onnx"
    if fault == "add_to_sub":
        faulted = onnx.load(str(out)).graph.node[inject_onnx(out, "add_to_sub", broken, seed=0).op].name
    else:
        faulted = _dense_bias_subtracted(out, broken)
    result = cli("verify", broken, "--source", folder, "--report", tmp_path / "r.json")
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert any(f["kind"] == "numeric" and "logits" in f["message"] for f in report["failures"])
    # the red run says where (its source reloaded from the folder for the task): the op, the module
    # its name scope says, and the source op it stands for (with the LayerNorm after it when the
    # sum is not a tensor of its own in the artifact)
    first = report["divergence"]["first"]
    assert (first["node"], first["op_type"]) == (faulted, "Sub"), first
    assert first["module"] == ".".join(faulted.split("/")[2:-1])
    assert first["covers"][0].startswith(("add", "linear")) and len(first["covers"]) <= 2, first["covers"]


def test_an_artifact_off_the_configs_gelu_fails_naming_the_config(folders, cli, tmp_path):
    folder = folders["bert-text-classification"]
    tanh = tmp_path / "tanh.onnx"
    made = cli("export", folder, "--to", "onnx", "--opset", "17", "--gelu", "tanh", "--out", tanh, "--no-verify")
    assert made.returncode == 0, made.stdout + made.stderr
    result = cli("verify", tanh, "--source", folder)
    assert result.returncode == 3, result.stdout + result.stderr
    said = result.stdout + result.stderr
    assert "GELU changed" in said and "the config declares hidden_act gelu (exact)" in said


def test_a_source_site_off_its_config_is_reported(folders, cli, tmp_path):
    """RoBERTa's masked-LM head computes exact GELU whatever hidden_act says: with hidden_act
    gelu_new the encoder's sites are tanh and the head's is not what the config declares."""
    result = cli("export", folders["roberta-fill-mask"], "--to", "onnx", "--opset", "17", "--out",
                 tmp_path / "roberta.onnx", "--report", tmp_path / "r.json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    off = report["gelu_configured"]["off"]
    assert sorted((o["side"], o["flavour"]) for o in off) == [("artifact", "exact"), ("source", "exact")]
    assert "1 source GELU site(s) compute another flavour than the config declares (hidden_act gelu_new (tanh))" \
        in result.stdout + result.stderr


@litert_torch_export
def test_a_decoder_exports_without_its_cache_and_a_vision_model_to_tflite_at_fixed_sizes(folders, cli, tmp_path):
    llama = cli("export", folders["llama-causal-lm"], "--task", "text-generation", "--to", "onnx", "--opset", "17",
                "--out", tmp_path / "llama.onnx", "--report", tmp_path / "llama.json")
    assert llama.returncode == 0, llama.stdout + llama.stderr
    report = json.loads((tmp_path / "llama.json").read_text())
    assert report["task"] == "text-generation" and not report["generation"]
    assert [d["symbol"] for d in report["dynamic"]] == ["batch_size", "batch_size", "sequence_length",
                                                        "sequence_length"]
    vit = cli("export", folders["vit-image-classification"], "--to", "tflite", "--out", tmp_path / "vit.tflite",
              "--report", tmp_path / "vit.json")
    assert vit.returncode == 0, vit.stdout + vit.stderr
    notes = json.loads((tmp_path / "vit.json").read_text())["notes"]
    assert any("litert-torch exports static shapes only: pixel_values axis 0" in note for note in notes)


@pytest.mark.parametrize("edit, code, message", [
    (lambda f: (f / "config.json").write_text("{"), 2, "config.json does not load"),
    (lambda f: (f / "model.safetensors").unlink(), 2, "no weights"),
    (lambda f: None, 4, "model type vit has no fill-mask head in transformers"),
])
def test_a_folder_that_cannot_be_exported_writes_nothing(folders, cli, tmp_path, edit, code, message):
    folder = shutil.copytree(folders["vit-image-classification"], tmp_path / "vit")
    edit(folder)
    out = tmp_path / "dist" / "vit.onnx"
    result = cli("export", folder, "--to", "onnx", "--task", "fill-mask" if code == 4 else "image-classification",
                 "--out", out)
    assert result.returncode == code, result.stdout + result.stderr
    assert message in result.stdout + result.stderr
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_a_tokenizer_of_another_model_in_the_out_folder_is_not_replaced(folders, cli, tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"another": "model"}')
    result = cli("export", folders["bert-text-classification"], "--to", "onnx", "--out", tmp_path / "bert.onnx")
    assert result.returncode == 2
    assert "tokenizer.json exists and is not" in result.stdout + result.stderr
    assert (tmp_path / "tokenizer.json").read_text() == '{"another": "model"}'
    assert not (tmp_path / "bert.onnx").exists()


def release_job(folders, tmp_path):
    """A release pipeline of one job, the BERT classifier's folder for its task, run once with a
    cache; returns (config, the folder, the run)."""
    folder = shutil.copytree(folders["bert-text-classification"], tmp_path / "classifier")
    config = tmp_path / "exportgate.toml"
    config.write_text('[models.classifier]\nspec = "classifier"\ntask = "text-classification"\n\n'
                      '[artifacts.onnx17]\nto = "onnx"\nopset = 17\n')
    return config, folder, runs.run(config, out_dir=tmp_path / "out", cache_dir=tmp_path / "cache")


def test_a_release_job_takes_a_folder_and_its_task_and_is_reused_unchanged(folders, tmp_path):
    config, _, cold = release_job(folders, tmp_path)
    [(_, report)] = cold.jobs
    assert report.exit_code == 0 and report.task == "text-classification" and report.model_type == "bert"
    assert (tmp_path / "out/classifier/onnx17/tokenizer.json").is_file()
    assert runs.run(config, out_dir=tmp_path / "out", cache_dir=tmp_path / "cache").reused == 1


@pytest.mark.slow  # a job's cache key covers the files its model reads: tests/exporter/test_runs.py, by default
def test_a_release_job_of_a_folder_runs_again_when_its_weights_change(folders, tmp_path):
    from transformers import AutoModelForSequenceClassification

    config, folder, cold = release_job(folders, tmp_path)
    assert cold.exit_code == 0
    model = AutoModelForSequenceClassification.from_pretrained(str(folder))
    model.classifier.bias.data += 1
    model.save_pretrained(str(folder))
    again = runs.run(config, out_dir=tmp_path / "out", cache_dir=tmp_path / "cache")
    assert again.reused == 0 and again.exit_code == 0


@pytest.fixture(scope="module")
def llama_with_past(folders, tmp_path_factory):
    """The Llama folder exported for its inferred task, with its KV cache (dynamo, opset 20), its
    report beside it."""
    out = tmp_path_factory.mktemp("llama") / "llama.onnx"
    result = run_cli_here("export", folders["llama-causal-lm"], "--to", "onnx", "--opset", "20", "--out", out,
                          "--report", out.parent / "report.json", cwd=out.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    return out, json.loads((out.parent / "report.json").read_text()), result


def test_a_decoder_with_past_takes_the_cache_in_the_runtime_layout_and_generates_as_transformers(llama_with_past):
    import onnx

    out, report, result = llama_with_past
    assert report["task"] == "text-generation-with-past"  # a causal LM's, inferred
    graph = onnx.load(str(out), load_external_data=False).graph
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.input}
    assert dims["input_ids"] == dims["position_ids"] == ["batch_size", "sequence_length"]
    assert dims["attention_mask"] == ["batch_size", "past_sequence_length + sequence_length"]
    assert dims["past_key_values.1.value"] == ["batch_size", 1, "past_sequence_length", 16]  # one KV head of 16
    assert [o.name for o in graph.output] == ["logits", "present.0.key", "present.0.value", "present.1.key",
                                              "present.1.value"]
    # every symbol held at other sizes, the mask's length moving with each of its parts
    assert {d["symbol"] for d in report["dynamic"] if d["status"] == "pass"} == {
        "batch_size", "sequence_length", "past_sequence_length"}
    generation = report["generation"]
    assert generation["decode_steps"] >= 3
    assert [s["past_length"] for s in generation["steps"]] == [0, 6, 7, 8, 9]
    assert tokens_agree(generation["steps"])
    assert "generates as transformers' generate does: prefill and 4 cached decode step(s)" in result.stderr


@pytest.mark.parametrize("breaking, first_step", [(swap_presents, 1), (restart_positions, 1)])
def test_a_broken_cache_fails_naming_the_decode_step_and_the_output(folders, llama_with_past, cli, tmp_path,
                                                                    breaking, first_step):
    out, _, _ = llama_with_past
    broken = tmp_path / "broken.onnx"
    breaking(out, broken)
    result = cli("verify", broken, "--source", folders["llama-causal-lm"], "--task", "text-generation-with-past",
                 "--no-localize", "--report", tmp_path / "r.json")
    assert result.returncode == 1, result.stdout + result.stderr
    failures = json.loads((tmp_path / "r.json").read_text())["failures"]
    generate = [f for f in failures if f["message"].startswith("generate: ")]
    assert generate and min(f["data"]["generate_step"] for f in generate) == first_step
    assert f"generate: decode step {first_step} (past length 6): output logits" in result.stderr
    assert all(f["output"] == "logits" for f in generate)


@pytest.fixture(scope="module")
def bart_parts(folders, tmp_path_factory):
    """The BART folder exported as an encoder and a decoder with past (dynamo, opset 20), each in a
    folder of its own, with its report (through the API: the CLI's --task is the Llama tests')."""
    parts = {}
    for part in ("encoder", "with-past"):
        out = tmp_path_factory.mktemp(part) / f"bart-{part}.onnx"
        report = api.export(str(folders["bart-text2text-generation"]), task=f"text2text-generation-{part}", to="onnx",
                            opset=20, out=out)
        assert report.exit_code == 0, report.summary_lines()
        parts[part] = out, report
    return parts


def _dims(path):
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return ({v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.input},
            [o.name for o in graph.output])


def test_an_encoder_decoder_exports_as_encoder_and_decoder_with_past_that_generate_together(folders, bart_parts):
    import numpy as np
    import onnxruntime as ort
    import torch
    from transformers import BartForConditionalGeneration

    (encoder, _), (decoder, report) = bart_parts["encoder"], bart_parts["with-past"]
    inputs, outputs = _dims(encoder)
    assert inputs == {"input_ids": ["batch_size", "encoder_sequence_length"],
                      "attention_mask": ["batch_size", "encoder_sequence_length"]}
    assert outputs == ["last_hidden_state", "present.0.encoder.key", "present.0.encoder.value",
                       "present.1.encoder.key", "present.1.encoder.value"]
    inputs, outputs = _dims(decoder)
    assert list(inputs)[:6] == ["input_ids", "encoder_attention_mask", "past_key_values.0.decoder.key",
                                "past_key_values.0.decoder.value", "past_key_values.0.encoder.key",
                                "past_key_values.0.encoder.value"]
    assert inputs["past_key_values.1.decoder.value"] == ["batch_size", 2, "past_decoder_sequence_length", 16]
    assert inputs["past_key_values.1.encoder.key"] == ["batch_size", 2, "encoder_sequence_length", 16]
    assert outputs == ["logits", "present.0.decoder.key", "present.0.decoder.value", "present.1.decoder.key",
                       "present.1.decoder.value"]
    assert report.task == "text2text-generation-with-past"
    assert [s["past_length"] for s in report.generation["steps"]] == [0, 1, 2, 3, 4]
    assert tokens_agree(report.generation["steps"])
    assert any("generates as transformers' generate does: prefill and 4 cached decode step(s)" in line
               for line in report.summary_lines())
    # The two artifacts chained as a runtime chains them generate what transformers' model does
    # called without any cache, on the whole sequence each step.
    rng = np.random.default_rng(3)
    prompt = rng.integers(3, 100, size=(2, 7))
    mask = np.ones_like(prompt)
    mask[0, :3] = 0
    encoded = dict(zip(outputs_of := [o.name for o in ort.InferenceSession(str(encoder)).get_outputs()],
                       ort.InferenceSession(str(encoder)).run(None, {"input_ids": prompt, "attention_mask": mask})))
    assert outputs_of[0] == "last_hidden_state"
    session = ort.InferenceSession(str(decoder))
    names = [o.name for o in session.get_outputs()]
    feed = {f"past_key_values.{i}.{part}.{kind}": (encoded[f"present.{i}.encoder.{kind}"] if part == "encoder"
                                                   else np.zeros((2, 2, 0, 16), np.float32))
            for i in range(2) for part in ("decoder", "encoder") for kind in ("key", "value")}
    tokens = np.full((2, 1), 2)  # the decoder start token
    for _ in range(5):
        step = dict(zip(names, session.run(None, {"input_ids": tokens[:, -1:], "encoder_attention_mask": mask, **feed})))
        tokens = np.concatenate([tokens, step["logits"][:, -1].argmax(-1)[:, None]], axis=1)
        feed.update({f"past_key_values.{i}.decoder.{kind}": step[f"present.{i}.decoder.{kind}"]
                     for i in range(2) for kind in ("key", "value")})
    model = BartForConditionalGeneration.from_pretrained(folders["bart-text2text-generation"]).eval()
    expected = torch.tensor([[2], [2]])
    with torch.no_grad():
        for _ in range(5):
            logits = model(input_ids=torch.from_numpy(prompt), attention_mask=torch.from_numpy(mask),
                           decoder_input_ids=expected, use_cache=False).logits
            expected = torch.cat([expected, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    np.testing.assert_array_equal(tokens, expected.numpy())


def test_a_decoder_with_past_of_swapped_layers_fails_naming_the_decode_step(folders, bart_parts, tmp_path):
    out, _ = bart_parts["with-past"]
    broken = tmp_path / "broken.onnx"
    swap_presents(out, broken)
    report = api.verify(broken, source=str(folders["bart-text2text-generation"]),
                        task="text2text-generation-with-past", localize=False)
    assert report.exit_code == 1, report.summary_lines()
    generate = [f for f in report.failures if f.message.startswith("generate: ")]
    assert min(f.data["generate_step"] for f in generate) == 1
    assert any(f.message.startswith("generate: decode step 1 (past length 1): output logits") for f in generate)


@pytest.fixture(scope="module")
def phi_llm(tmp_path_factory):
    """The Phi folder (tanh GELU) exported for its inferred task to TFLite: the LLM of prefill and
    decode signatures litert-torch's export_hf writes; its report beside it."""
    root = tmp_path_factory.mktemp("phi")
    folder = save_folder("phi-causal-lm", root / "phi")
    out = root / "dist" / "phi.tflite"
    result = run_cli_here("export", folder, "--to", "tflite", "--out", out, "--report", root / "report.json", cwd=root)
    assert result.returncode == 0, result.stdout + result.stderr
    return folder, out, json.loads((root / "report.json").read_text()), result


@litert_torch_export
def test_a_decoder_with_past_exports_to_a_tflite_llm_that_generates_as_transformers(phi_llm, cli):
    from verifiers.tflite_model import load_tflite

    _, out, report, result = phi_llm
    assert report["exporter"] == "litert-torch export_hf"
    signatures = {s.key: s for s in load_tflite(out).signatures}
    assert set(signatures) == {"prefill_32", "decode"}  # prefill chunks of half the 64 positions
    assert {name for name, _ in signatures["decode"].outputs} == {
        "logits", "kv_cache_k_0", "kv_cache_v_0", "kv_cache_k_1", "kv_cache_v_1"}
    steps = report["generation"]["steps"]
    assert len(steps) == 5 and tokens_agree(steps)
    assert max(s["max_abs_err"] for s in steps) < 1e-4
    # the GELU guard reads the prefill: both layers' tanh GELUs, kept
    assert [(g["measured"], g["status"]) for g in report["gelu"]] == [("tanh", "kept")] * 2
    assert "generates as transformers' generate does: prefill and 4 cached decode step(s)" in result.stderr
    assert sorted(report["published_beside"]) == ["generation_config.json", "tokenizer.json", "tokenizer_config.json"]
    inspected = cli("inspect", out)
    assert "signatures: prefill_32, decode (inputs and outputs of prefill_32)" in inspected.stdout


@litert_torch_export
def test_a_tflite_llm_with_its_cache_layers_swapped_fails_naming_the_decode_step(phi_llm, cli, tmp_path):
    folder, out, _, _ = phi_llm
    broken = tmp_path / "broken.tflite"
    swap_presents(out, broken)
    result = cli("verify", broken, "--source", folder, "--report", tmp_path / "r.json")
    assert result.returncode == 1, result.stdout + result.stderr
    failures = json.loads((tmp_path / "r.json").read_text())["failures"]
    assert min(f["data"]["generate_step"] for f in failures if f["message"].startswith("generate: ")) == 1
    assert "generate: decode step 1 (past length 6): output logits" in result.stderr


def test_a_decoder_without_a_tokenizer_cannot_go_to_a_tflite_llm(folders, cli, tmp_path):
    folder = shutil.copytree(folders["llama-causal-lm"], tmp_path / "llama")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    out = tmp_path / "dist" / "llama.tflite"
    result = cli("export", folder, "--to", "tflite", "--out", out)
    assert result.returncode == 4, result.stdout + result.stderr
    assert "model type llama, task text-generation-with-past: litert-torch's export_hf reads the folder's tokenizer" in (
        result.stdout + result.stderr)
    assert not out.parent.exists() or not any(out.parent.iterdir())


@litert_torch_export
def test_a_float16_tflite_export_says_only_its_own_lines(folders, tmp_path):
    """ai-edge-quantizer draws tqdm bars for a model of 100 ops and more; they stay off stderr
    without --verbose, and a float-weight artifact's report lists no float ops (all of them are).
    The BERT is green in float16 arithmetic too (XNNPACK forced to FP16), where this CPU runs it
    (else exit 4, saying so). A child process: what reaches its descriptor 2 is what is tested."""
    result = run_cli("export", folders["bert-text-classification"], "--to", "tflite", "--quantize", "fp16",
                     "--out", "bert.tflite", "--report", "r.json", cwd=tmp_path)
    report = json.loads((tmp_path / "r.json").read_text())
    exercised = not report["arithmetic"]["float16"].startswith("not run")
    assert result.returncode == (0 if exercised else 4), result.stderr
    assert all(line.startswith(("exportgate: ", "PASS ", "FAIL ", "  ")) for line in result.stderr.splitlines()), result.stderr
    quantization = report["quantization"]
    assert quantization["mode"] == "fp16" and "float_ops" not in quantization
    if exercised:
        assert report["arithmetic"]["float16"].startswith("float16: XNNPACK forced to FP16")
        assert report["variant_outputs"]["float16"] and all(o["passed"] for o in report["variant_outputs"]["float16"])


def test_data_on_an_encoder_decoders_decoder_with_past_is_exit_2_naming_the_encoder(folders, bart_parts, tmp_path):
    """Its prompts go through the encoder, which the decoder is not."""
    (tmp_path / "prompts.txt").write_text("t5 t6 t7\n")
    decoder, _ = bart_parts["with-past"]

    report = api.verify(decoder, source=str(folders["bart-text2text-generation"]),
                        task="text2text-generation-with-past", data=str(tmp_path / "prompts.txt"))

    assert report.exit_code == 2
    [finding] = report.failures
    assert finding.message.startswith("--data on text2text-generation-with-past:"), finding.message
    assert finding.message.endswith("give --data to the encoder's export (text2text-generation-encoder)")
