"""Every model folder of fixtures/models/hf_folders.py, exported for its inferred task (or the one
given, where its head serves several) to ONNX at opsets 17 and 20 and to TFLite, and verified at
several sizes of each dynamic axis; every decoder with its KV cache (to TFLite: the LLM of prefill
and decode signatures), which must generate as transformers' generate does, and without it; every
encoder-decoder as its encoder and its decoder with past (docs/guides/transformers-folders.md:
the table of cells). Slow.
"""

import pytest

from exporter import api
from fixtures.generation import tokens_agree
from fixtures.models.hf_folders import FOLDERS, save_folder

pytestmark = pytest.mark.slow

CELLS = [("onnx", 17), ("onnx", 20), ("tflite", None)]
DECODERS = [name for name, spec in FOLDERS.items() if spec.task == "text-generation-with-past"]
# each encoder-decoder and the task it is split for (<task>-encoder, <task>-with-past)
ENCODER_DECODERS = {name: spec.task for name, spec in FOLDERS.items()
                    if spec.task in ("text2text-generation", "automatic-speech-recognition")}
LLM_UNSUPPORTED = ["gpt2-causal-lm"]  # model types litert-torch's export_hf does not export


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("folders")
    return {name: save_folder(name, root / name) for name in FOLDERS}


@pytest.mark.parametrize("to, opset", CELLS, ids=["onnx17", "onnx20", "tflite"])
@pytest.mark.parametrize("name", FOLDERS)
def test_each_folder_exports_and_verifies(saved, tmp_path, name, to, opset):
    out = tmp_path / f"{name}.{to}"
    report = api.export(str(saved[name]), to=to, out=out, opset=opset, task=FOLDERS[name].given_task)
    if to == "tflite" and name in LLM_UNSUPPORTED:  # docs/guides/transformers-folders.md: the exit-4 cells and their reasons
        assert report.exit_code == 4 and not out.exists()
        assert f"model type {FOLDERS[name].model_type}, task text-generation-with-past: litert-torch's export_hf " \
               "cannot export it" in report.summary_lines()[1]
        return
    assert report.exit_code == 0, report.summary_lines()
    assert (report.model_type, report.task) == (FOLDERS[name].model_type, FOLDERS[name].task)
    assert out.is_file()
    if to == "onnx":  # every task axis held at its export size and three others
        symbols = {entry["symbol"] for entry in report.dynamic}
        assert "batch_size" in symbols
        assert all(entry["status"] == "pass" and len(entry["sizes"]) >= 3 for entry in report.dynamic)
        if name in DECODERS:
            assert symbols == {"batch_size", "sequence_length", "past_sequence_length"}
    elif name in DECODERS:  # the LLM of prefill and decode signatures litert-torch's export_hf writes
        assert report.exporter == "litert-torch export_hf"
    else:  # litert-torch exports at the example's sizes
        assert any("static shapes only" in note for note in report.notes)
    if name in DECODERS:  # and the cache generates as transformers' generate does
        steps = report.generation["steps"]
        assert len(steps) >= 4 and steps[0]["past_length"] == 0 and all(s["past_length"] > 0 for s in steps[1:])
        assert tokens_agree(steps)


@pytest.mark.parametrize("to, opset", CELLS, ids=["onnx17", "onnx20", "tflite"])
@pytest.mark.parametrize("part", ["encoder", "with-past"])
@pytest.mark.parametrize("name", ENCODER_DECODERS)
def test_each_encoder_decoder_exports_as_encoder_and_decoder_with_past(saved, tmp_path, name, part, to, opset):
    out = tmp_path / f"{name}-{part}.{to}"
    task = f"{ENCODER_DECODERS[name]}-{part}"
    report = api.export(str(saved[name]), to=to, out=out, opset=opset, task=task)
    if to == "tflite" and part == "with-past":  # docs/guides/transformers-folders.md: the exit-4 cells and their reasons
        assert report.exit_code == 4 and not out.exists()
        assert f"model type {FOLDERS[name].model_type}, task {task}: the torch -> tflite route (litert-torch) exports " \
               "fixed sizes" in report.summary_lines()[1]
        return
    assert report.exit_code == 0, report.summary_lines()
    assert report.task == task and out.is_file()
    if to == "onnx":
        assert all(entry["status"] == "pass" and len(entry["sizes"]) >= 3 for entry in report.dynamic)
    if part == "with-past":  # the decoder's own cache generates as transformers' generate does
        steps = report.generation["steps"]
        assert [s["past_length"] for s in steps] == [0, 1, 2, 3, 4]
        assert tokens_agree(steps)
    else:  # every decoder layer's cross-attention keys and values beside the hidden states
        assert report.outputs[0].name == "last_hidden_state"
        assert [o.name for o in report.outputs[1:3]] == ["present.0.encoder.key", "present.0.encoder.value"]


@pytest.mark.parametrize("to, opset", CELLS, ids=["onnx17", "onnx20", "tflite"])
@pytest.mark.parametrize("name", DECODERS)
def test_each_decoder_exports_without_its_cache(saved, tmp_path, name, to, opset):
    out = tmp_path / f"{name}.{to}"
    report = api.export(str(saved[name]), to=to, out=out, opset=opset, task="text-generation")
    assert report.exit_code == 0, report.summary_lines()
    assert not report.generation


def test_a_folder_exported_to_onnx_after_an_llm_to_tflite_in_one_process_is_transformers_own(saved, tmp_path):
    """litert-torch's export_hf patches transformers' kernel decorator when it is imported: a model
    type whose modeling module is first imported after it (Qwen2 here, after a Llama LLM went to
    TFLite) got litert-torch's RMSNorm, which torch.onnx cannot export. A fresh process, so that
    Qwen2's module is imported there for the first time, after the LLM export."""
    import sys

    from fixtures.children import REPO, run_child

    code = ("import sys\nfrom exporter import api\n"
            "llm = api.export(sys.argv[1], to='tflite', out=sys.argv[3] + '/llama.tflite')\n"
            "onnx = api.export(sys.argv[2], to='onnx', opset=17, out=sys.argv[3] + '/qwen2.onnx')\n"
            "print(llm.exit_code, onnx.exit_code)\nprint(*onnx.summary_lines()[:2], sep='\\n')\n")
    done = run_child([sys.executable, "-c", code, saved["llama-causal-lm"], saved["qwen2-causal-lm"], tmp_path],
                     cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[0] == "0 0", done.stdout
