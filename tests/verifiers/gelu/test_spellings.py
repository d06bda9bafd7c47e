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
    return {name: flavour for name, (_, flavour, _) in module.SPELLINGS.items()}


# framework -> (spec of a builder, spelling -> flavour)
FRAMEWORKS = {"torch": (torch_spelling, _spellings(TORCH_SPELLINGS)),
              "keras": (keras_spelling, _spellings(KERAS_SPELLINGS))}
CASES = [(fw, name) for fw, (_, names) in FRAMEWORKS.items() for name in sorted(names)]
ROUTES = [("onnx", 13), ("onnx", 17), ("onnx", 20), ("tflite", None)]
# What the exporters cannot do, and the line that must say so (exit 4): the TorchScript exporter
# has no aten::erfc below opset 17, litert-torch no lowering for it, and the TFLite converter no
# float16 MatMul builtin.
UNSUPPORTED = {
    ("torch", "erfc", "onnx", 13): "aten::erfc",
    ("torch", "erfc", "tflite", None): "aten.erfc",
    ("keras", "upcast_half", "tflite", None): "FlexMatMul",
}


def _export(spec, to, opset, out, verify=True):
    return api.export(spec, to=to, opset=opset, out=out / f"m.{to}", verify=verify)


# The opsets on either side of 17 are the slow suite's: the default one runs each spelling at 17
# and to TFLite.
ROUTE_PARAMS = [pytest.param(to, opset, id=f"{to}{opset or ''}",
                             marks=[pytest.mark.slow] if opset in (13, 20) else []) for to, opset in ROUTES]


@pytest.mark.parametrize(("to", "opset"), ROUTE_PARAMS)
@pytest.mark.parametrize(("framework", "name"), CASES, ids=[f"{fw}-{n}" for fw, n in CASES])
def test_spelling_is_found_and_kept_on_every_route(tmp_path, framework, name, to, opset):
    spec, flavours = FRAMEWORKS[framework]
    report = _export(spec(f"{name}_mlp"), to, opset, tmp_path)
    unsupported = UNSUPPORTED.get((framework, name, to, opset))
    if unsupported:
        assert report.exit_code == 4 and unsupported in report.failures[0].message
        return
    assert report.exit_code == 0, report.summary_lines()
    assert report.gelu_guard == "checked"
    flavour = flavours[name]
    assert [(g["status"], g["source_flavour"], g["measured"]) for g in report.gelu] == [("kept", flavour, flavour)]


# A changed copy needs an artifact of the swapped model. Keras' upcast_half MLP has float16 Dense
# layers, which the TFLite converter cannot convert (FlexMatMul, asserted above) whatever the
# activation: there is no TFLite artifact of it to change, so that case is not parametrized.
NO_CHANGED_ARTIFACT = {("keras", "upcast_half", "tflite", None)}
# The default suite changes each spelling in an ONNX artifact; the TFLite copies are the slow suite's
# (the TFLite guard's own broken files are in tests/verifiers/gelu/test_tflite_guard.py).
CHANGED_CASES = [pytest.param(fw, name, to, opset, id=f"{fw}-{name}-{to}",
                              marks=[pytest.mark.slow] if to == "tflite" else [])
                 for fw, name in CASES for to, opset in [("onnx", 17), ("tflite", None)]
                 if (fw, name, to, opset) not in NO_CHANGED_ARTIFACT]


@pytest.mark.parametrize(("framework", "name", "to", "opset"), CHANGED_CASES)
def test_spelling_changed_in_the_artifact_is_exit_3(tmp_path, framework, name, to, opset):
    spec, flavours = FRAMEWORKS[framework]
    exported = _export(spec(f"swapped_{name}"), to, opset, tmp_path, verify=False)  # the artifact is all it is for
    assert exported.exit_code == 0, exported.summary_lines()
    # the guard's verdict is what is tested: where the outputs first depart is not asked for
    report = api.verify(tmp_path / f"m.{to}", source=spec(f"{name}_mlp"), localize=False)
    assert report.exit_code == 3, report.summary_lines()
    [entry] = report.gelu
    assert entry["status"] == "changed" and entry["source_flavour"] == flavours[name]
    assert entry["measured"] != flavours[name]
