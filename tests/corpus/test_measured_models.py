"""Third-party models measured on both formats: BERT, ViT and GPT-2 model folders (transformers,
from tiny configs) and keras.applications' MobileNetV2 (random weights), each exported to ONNX and
to TFLite with --measure, and the artifact measured again by `exportgate measure` with no source
(GPT-2's ONNX decoder with past takes no random batch: its mask must span past and tokens, which
measure says, exit 2, asking for --input).
What holds whatever the machine: every way the runtime runs the artifact is timed, with an
interval around its median, the worker's memory grows from the load, onnxruntime's profile names
op types the runtime ran, and the larger batch is measured exactly where every input's first axis
is dynamic. Slow.
"""

import pytest

from exporter import api
from fixtures.models.hf_folders import save_folder
from fixtures.specs import MODELS
from verifiers.measurement import LARGER_BATCH, MIN_RUNS

pytestmark = pytest.mark.slow

# name -> (folder or file.py:builder, task per format: GPT-2 goes to TFLite without its cache, as
# litert-torch's export_hf does not take it)
SOURCES = {
    "bert": ("bert-text-classification", {}),
    "vit": ("vit-image-classification", {}),
    "gpt2": ("gpt2-causal-lm", {"tflite": "text-generation"}),
    "mobilenet_v2": (f"{MODELS / 'int8_models.py'}:keras_mobilenet_v2", {}),
}
WAYS = {"onnx": ["default"], "tflite": ["xnnpack", "builtin"]}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("folders")
    return {name: str(save_folder(folder, root / folder)) for name, (folder, _) in SOURCES.items()
            if ":" not in folder}


def _sound(measured: dict, to: str) -> None:
    assert measured["runtime"] == {"onnx": "onnxruntime", "tflite": "ai-edge-litert"}[to]
    assert measured["peak_rss_mb"] >= measured["rss_before_load_mb"] > 0 and measured["load_seconds"] > 0
    assert [t["variant"] for t in measured["timings"] if t["batch"] == measured["timings"][0]["batch"]] == WAYS[to]
    for t in measured["timings"]:
        assert t["runs"] >= MIN_RUNS
        assert 0 < t["min_ms"] <= t["low_ms"] <= t["median_ms"] <= t["high_ms"] <= t["max_ms"]
    batches = sorted({t["batch"] for t in measured["timings"]})
    if measured["larger_batch"] is None:
        assert batches == [batches[0], LARGER_BATCH * batches[0]]
    else:
        assert len(batches) == 1


@pytest.mark.parametrize("to", ["onnx", "tflite"])
@pytest.mark.parametrize("name", SOURCES)
def test_a_third_party_model_is_measured_on_each_format(folders, tmp_path, name, to):
    spec, tasks = SOURCES[name]
    out = tmp_path / f"{name}.{to}"
    report = api.export(folders.get(name, spec), to=to, out=out, opset=17 if to == "onnx" else None,
                        task=tasks.get(to), measure=True, measure_seconds=0.3)
    assert report.exit_code == 0, report.summary_lines()
    _sound(report.measurement, to)
    if to == "onnx":  # onnxruntime's profiler: the time goes to the model's matrix products or convolutions
        assert {"MatMul", "Gemm", "Conv", "FusedMatMul", "FusedConv"} & set(report.measurement["profile"])
    else:
        assert report.measurement["profile"] == {}  # LiteRT's Python API has no profiler to read

    again = api.measure(out, measure_seconds=0.2)
    if (name, to) == ("gpt2", "onnx"):  # random inputs cannot say that the mask spans the past and the tokens
        assert again.exit_code == 2 and "give each input's shape and range with --input" in again.failures[0].message
        return
    assert again.exit_code == 0, again.summary_lines()
    _sound(again.measurement, to)
