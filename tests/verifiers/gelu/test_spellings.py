"""Every GELU spelling the guard must see, written in PyTorch and in Keras the way model code and
tutorials write them: found on both sides with the flavour it computes after every route, and a
copy whose GELU computes another flavour (a SiLU, for two of them) caught with exit 3."""

import importlib.util

import pytest

from exporter import api
from fixtures.specs import KERAS_SPELLINGS, TORCH_SPELLINGS, keras_spelling, torch_spelling


def _spellings(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SPELLINGS


TORCH = {name: flavour for name, (_, flavour, _) in _spellings(TORCH_SPELLINGS).items()}
# (route, opset); the TorchScript exporter has no aten::erfc below opset 17 and litert-torch no
# lowering for it: those cells must fail with the exporter's own line (exit 4).
ROUTES = [("onnx", 13), ("onnx", 17), ("onnx", 20), ("tflite", None)]
UNSUPPORTED = {("erfc", "onnx", 13): "aten::erfc", ("erfc", "tflite", None): "aten.erfc"}


def _export(spec, to, opset, out):
    return api.export(spec, to=to, opset=opset, out=out / f"m.{to}")


def _kept_flavours(report):
    return [(g["status"], g["source_flavour"], g["measured"]) for g in report.gelu]


@pytest.mark.parametrize(("to", "opset"), ROUTES, ids=[f"{t}{o or ''}" for t, o in ROUTES])
@pytest.mark.parametrize("name", sorted(TORCH))
def test_torch_spelling_is_found_and_kept_on_every_route(tmp_path, name, to, opset):
    report = _export(torch_spelling(f"{name}_mlp"), to, opset, tmp_path)
    if (name, to, opset) in UNSUPPORTED:
        assert report.exit_code == 4 and UNSUPPORTED[name, to, opset] in report.failures[0].message
        return
    assert report.exit_code == 0, report.summary_lines()
    assert report.gelu_guard == "checked"
    assert _kept_flavours(report) == [("kept", TORCH[name], TORCH[name])]


@pytest.mark.parametrize("name", sorted(TORCH))
def test_torch_spelling_changed_in_the_artifact_is_exit_3(tmp_path, name):
    exported = _export(torch_spelling(f"swapped_{name}"), "onnx", 17, tmp_path)
    assert exported.exit_code == 0, exported.summary_lines()
    report = api.verify(tmp_path / "m.onnx", source=torch_spelling(f"{name}_mlp"))
    assert report.exit_code == 3, report.summary_lines()
    [entry] = report.gelu
    assert entry["status"] == "changed" and entry["source_flavour"] == TORCH[name]
    assert entry["measured"] != TORCH[name]


KERAS = {name: flavour for name, (_, flavour, _) in _spellings(KERAS_SPELLINGS).items()}
# The TFLite converter has no float16 MatMul builtin (it would need Flex ops).
KERAS_UNSUPPORTED = {("upcast_half", "tflite", None): "FlexMatMul"}


@pytest.mark.parametrize(("to", "opset"), ROUTES, ids=[f"{t}{o or ''}" for t, o in ROUTES])
@pytest.mark.parametrize("name", sorted(KERAS))
def test_keras_spelling_is_found_and_kept_on_every_route(tmp_path, name, to, opset):
    report = _export(keras_spelling(f"{name}_mlp"), to, opset, tmp_path)
    if (name, to, opset) in KERAS_UNSUPPORTED:
        assert report.exit_code == 4 and KERAS_UNSUPPORTED[name, to, opset] in report.failures[0].message
        return
    assert report.exit_code == 0, report.summary_lines()
    assert report.gelu_guard == "checked"
    assert _kept_flavours(report) == [("kept", KERAS[name], KERAS[name])]


@pytest.mark.parametrize("to", ["onnx", "tflite"])
@pytest.mark.parametrize("name", sorted(KERAS))
def test_keras_spelling_changed_in_the_artifact_is_exit_3(tmp_path, name, to):
    if (name, to, None) in KERAS_UNSUPPORTED:
        pytest.skip("no such artifact: the route cannot convert the model")
    exported = _export(keras_spelling(f"swapped_{name}"), to, 17 if to == "onnx" else None, tmp_path)
    assert exported.exit_code == 0, exported.summary_lines()
    report = api.verify(tmp_path / f"m.{to}", source=keras_spelling(f"{name}_mlp"))
    assert report.exit_code == 3, report.summary_lines()
    [entry] = report.gelu
    assert entry["status"] == "changed" and entry["source_flavour"] == KERAS[name]
    assert entry["measured"] != KERAS[name]
