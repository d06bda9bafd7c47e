"""PyTorch -> TFLite through litert-torch, run in ai-edge-litert (XNNPACK and builtin)."""


import numpy as np
import pytest

from verifiers.errors import Incompatible
from exporter.routes import ExportRequest, route_for
from exporter.frameworks import load_source
from exporter.sources import make_batches
from verifiers.sizes import DynamicAxis
from fixtures.specs import torch_model
from verifiers.gelu.catalogue import TANH
from verifiers.formats.tflite.gelu_sites import find_tflite_sites
from verifiers.runtimes import runtime_for
from verifiers.runtimes.litert_runner import LiteRtRunner
from verifiers.tflite_model import load_tflite

MODELS = ["mlp_exact", "mlp_tanh", "block_exact", "block_tanh"]
# Max abs error against PyTorch. float32: ~2e-6 at most (block_tanh with XNNPACK).
# fp16 weights: ~3e-4. dynamic-int8 (ai-edge-quantizer, int8 channelwise weights): ~1.5e-2.
ATOL = {None: 1e-5, "fp16": 2e-3, "dynamic-int8": 5e-2}


def gelu_flags(path) -> list[bool]:
    """GeluOptions.approximate of every GELU builtin (no options table means exact)."""
    return [site.claimed == TANH for site in find_tflite_sites(load_tflite(path)) if site.op == "GELU"]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """export(name, quantize) -> (source, feeds, reference, path, result), converted once per module."""
    cache = {}
    folder = tmp_path_factory.mktemp("torch_tflite")

    def _export(name, quantize=None):
        if (name, quantize) not in cache:
            source = load_source(torch_model(name))
            feeds = make_batches(source, 0, 2)
            reference = [source.run(feed) for feed in feeds]
            path = folder / f"{name}_{quantize}.tflite"
            result = route_for("torch", "tflite").export(
                source, ExportRequest("tflite", output_names=reference[0][0], sample_inputs=feeds[0],
                                      quantize=quantize),
                path, progress=lambda m: None)
            cache[(name, quantize)] = (source, feeds, reference, path, result)
        return cache[(name, quantize)]

    return _export


def max_errors(runner, feeds, reference) -> dict[str, float]:
    errors = dict.fromkeys(runner.variants, 0.0)
    for feed, (names, _, arrays) in zip(feeds, reference):
        assert [o.name for o in runner.outputs] == names
        for key, outputs in runner.run_all({i.name: feed[i.name] for i in runner.inputs}).items():
            errors[key] = max(errors[key], *(float(np.abs(a - b).max()) for a, b in zip(outputs, arrays)))
    return errors


@pytest.mark.parametrize("quantize", [None, "fp16"])
@pytest.mark.parametrize("name", MODELS)
def test_matches_torch_in_both_interpreters(export, name, quantize):
    source, feeds, reference, path, result = export(name, quantize)

    assert path.read_bytes()[4:8] == b"TFL3"
    assert result.exporter.startswith("litert-torch ")
    assert any("NCHW" in note for note in result.notes)
    runner = runtime_for("tflite")(path)
    assert [i.name for i in runner.inputs] == source.input_names  # not args_0
    errors = max_errors(runner, feeds, reference)
    interpreters = [error for variant, error in errors.items() if variant != "float16"]
    assert max(interpreters) < ATOL[quantize], errors
    assert errors.get("float16", 0.0) < 1e-2, errors  # XNNPACK forced to FP16: float16 arithmetic's rounding
    assert gelu_flags(path) == [name.endswith("_tanh")]


def test_dynamic_int8(export):
    _, feeds, reference, path, result = export("mlp_exact", "dynamic-int8")
    errors = max_errors(LiteRtRunner(path), feeds, reference)
    assert 1e-4 < max(errors.values()) < ATOL["dynamic-int8"], errors
    assert gelu_flags(path) == [False]  # GELU stays float32 with its flag
    assert any("dynamic-int8" in note for note in result.notes)
    assert not any(op.startswith("Flex") for op in [code.name for code in load_tflite(path).opcodes])


def test_keyword_inputs_keep_their_names_and_int64(export):
    _, feeds, reference, path, result = export("keyword_inputs")
    runner = LiteRtRunner(path)
    assert [(i.name, i.dtype) for i in runner.inputs] == [("input_ids", "int64"), ("scale", "float32")]
    assert [o.name for o in runner.outputs] == ["logits"]
    assert any("enable_x64" in note for note in result.notes)
    assert max(max_errors(runner, feeds, reference).values()) < 1e-5


def test_dynamic_axes_are_refused(tmp_path):
    source = load_source(torch_model("mlp_exact"))
    with pytest.raises(Incompatible, match="--dynamic input axis 0: litert-torch .* cannot keep it dynamic"):
        route_for("torch", "tflite").export(
            source, ExportRequest("tflite", dynamic=[DynamicAxis("input", 0)], sample_inputs=source.example),
            tmp_path / "m.tflite", progress=lambda m: None)


def test_without_output_names_or_sample_inputs(tmp_path):
    """Called bare, the route takes the example inputs and the source's own output names."""
    source = load_source(torch_model("mlp_tanh"))
    route_for("torch", "tflite").export(source, ExportRequest("tflite"), tmp_path / "m.tflite", progress=lambda m: None)
    runner = LiteRtRunner(tmp_path / "m.tflite")
    assert [o.name for o in runner.outputs] == ["output"]
    feed = make_batches(source, 3, 1)[-1]
    np.testing.assert_allclose(runner.run(feed)[0], source.run(feed)[2][0], atol=1e-5)


def test_torch_export_program(tmp_path):
    """A .pt2 source: its module() refuses eval(), which the route must not call."""
    import torch

    from fixtures.models.torch_models import block_exact

    model, example = block_exact()
    torch.export.save(torch.export.export(model, example), tmp_path / "block.pt2")
    source = load_source(str(tmp_path / "block.pt2"), trust_source=True)
    route_for("torch", "tflite").export(source, ExportRequest("tflite"), tmp_path / "m.tflite", progress=lambda m: None)
    runner = LiteRtRunner(tmp_path / "m.tflite")
    assert [i.name for i in runner.inputs] == source.input_names
    feed = make_batches(source, 0, 1)[0]
    np.testing.assert_allclose(runner.run(feed)[0], source.run(feed)[2][0], atol=1e-5)


def test_expand_reshape_transpose_is_concatenated_before_conversion(tmp_path):
    """litert-torch 0.10 drops the transpose after a broadcasting expand and reshape (grouped-query
    attention's repeat_kv). The route writes such expands as concatenations of copies, the same
    values, before any litert-torch converts the model; the conversion of the model as it is is
    judged by what it computes, whether that litert-torch has the bug or not."""
    import litert_torch
    import torch

    from exporter import api
    from exporter.routes.torch_tflite import concat_broadcasts

    spec = torch_model("grouped_query_scores")
    source = load_source(spec)
    sample = tuple(torch.from_numpy(value) for value in source.example.values())

    captured = torch.export.export(source.model, sample).module()
    assert concat_broadcasts(torch, captured) == 1
    targets = [node.target for node in captured.graph.nodes]
    assert torch.ops.aten.expand.default not in targets and torch.ops.aten.cat.default in targets
    with torch.no_grad():
        np.testing.assert_allclose(captured(*sample).numpy(), source.model(*sample).numpy(), rtol=0, atol=1e-6)

    report = api.export(spec, to="tflite", out=tmp_path / "m.tflite")
    assert report.exit_code == 0, report.summary_lines()
    assert any("1 broadcasting expand(s) read by a reshape written as concatenations" in n for n in report.notes)
    assert [g["status"] for g in report.gelu] == ["kept"]

    raw = tmp_path / "raw.tflite"
    raw.write_bytes(litert_torch.convert(source.model, sample).model_content())
    runner = LiteRtRunner(raw)
    [expected] = source.run(source.example)[2]
    computed = runner.run_all({runner.inputs[0].name: source.example[source.input_names[0]]})
    right = all(np.allclose(outputs[0], expected, atol=1e-4, rtol=1e-3) for outputs in computed.values())
    verified = api.verify(raw, source=spec)
    assert verified.exit_code == (0 if right else 1), (right, verified.summary_lines())
