"""The GELU guard on third-party models nobody tuned it to (slow): transformers architectures,
keras.applications and keras-hub backbones built in code with random weights, exported through
every route that applies (ONNX 13, 17, 18 and 20, TFLite; the zoo is `fixtures/zoo.py`), plus
artifacts written by other tools (onnxruntime's transformer optimizer, onnx2tf) verified against
their sources.

A cell passes with no false alarm: the export verifies, and the GELU sites found are exactly the
GELU computations that reach the outputs (`GELUS` in the builder files, by construction of each
architecture), all kept, with the architecture's flavour; dead ones are listed unused. A cell the
exporter cannot do ends in exit 4 (or the exit the known defect gives) with the line naming it.
"""

import hashlib
from collections import Counter

import onnx
import pytest

from exporter import api
from fixtures import zoo

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

TRANSFORMERS = zoo.GROUPS["transformers"]
KERAS = zoo.GROUPS["keras"]
CELLS = list(zoo.cells())


@pytest.mark.parametrize(("group", "name", "to", "opset"), CELLS,
                         ids=[f"{name}-{zoo.route_id(to, opset)}" for _, name, to, opset in CELLS])
def test_zoo_cell(request, tmp_path, group, name, to, opset):
    if group == "keras":
        request.getfixturevalue("keras_hub_path")
    report = api.export(zoo.spec(group, name), to=to, opset=opset, inputs=zoo.INPUTS.get((name, to), ()),
                        out=tmp_path / f"m.{to}")
    known = zoo.KNOWN.get((name, to, opset))
    if known is not None:
        code, text = known
        assert report.exit_code == code and any(text in f.message for f in report.failures), report.summary_lines()
        return
    assert report.exit_code == 0, report.summary_lines()
    assert report.gelu_guard == "checked"
    statuses = Counter((g["status"], g["source_flavour"], g["measured"]) for g in report.gelu)
    assert statuses == zoo.expected_gelu(group, name)


@pytest.fixture(scope="module")
def bert_onnx(tmp_path_factory):
    out = tmp_path_factory.mktemp("bert") / "bert.onnx"
    report = api.export(f"{TRANSFORMERS}:bert", to="onnx", opset=17, out=out)
    assert report.exit_code == 0, report.summary_lines()
    return out


@pytest.mark.parametrize(("approximate", "exit_code", "ops"), [
    (False, 0, {"com.microsoft.Gelu"}),  # the erf chain fused into the exact kernel
    (True, 3, {"com.microsoft.FastGelu"}),  # enable_gelu_approximation: exact turned tanh, silently
])
def test_onnxruntime_transformer_optimizer_artifacts(tmp_path, bert_onnx, approximate, exit_code, ops):
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.enable_gelu_approximation = approximate
    optimized = optimize_model(str(bert_onnx), model_type="bert", num_heads=2, hidden_size=32,
                               optimization_options=options)
    path = tmp_path / "optimized.onnx"
    optimized.save_model_to_file(str(path))
    report = api.verify(path, source=f"{TRANSFORMERS}:bert")
    assert report.exit_code == exit_code, report.summary_lines()
    assert {g["op"] for g in report.gelu} == ops and len(report.gelu) == 2
    assert all(g["status"] == ("changed" if approximate else "kept") for g in report.gelu)


@pytest.mark.parametrize(("name", "flavour"), [("two_gelu_mlp_exact", "exact"), ("two_gelu_mlp_tanh", "tanh")])
def test_onnx2tf_artifacts(tmp_path, onnx2tf, name, flavour):
    exported = api.export(f"{TRANSFORMERS}:{name}", to="onnx", opset=17, out=tmp_path / "m.onnx")
    assert exported.exit_code == 0, exported.summary_lines()
    tflite = onnx2tf(tmp_path / "m.onnx", tmp_path / "onnx2tf")
    report = api.verify(tflite, source=f"{TRANSFORMERS}:{name}")
    assert report.exit_code == 0, report.summary_lines()
    assert [(g["status"], g["measured"]) for g in report.gelu] == [("kept", flavour)] * 2
    other = "two_gelu_mlp_tanh" if flavour == "exact" else "two_gelu_mlp_exact"
    changed = api.verify(tflite, source=f"{TRANSFORMERS}:{other}", atol=["1e-2"])
    assert changed.exit_code == 3 and all(g["status"] == "changed" for g in changed.gelu)
    # onnx2tf rewrites its input in place: it worked on a copy, and the export is what its report hashed.
    assert hashlib.sha256((tmp_path / "m.onnx").read_bytes()).hexdigest() == exported.artifact.sha256


@pytest.mark.parametrize("name", ["hub_bert", "hub_distilbert"])
def test_keras_hub_artifact_with_a_changed_gelu_is_exit_3(tmp_path, keras_hub_path, name):
    # keras-hub backbones take a dict of inputs in unsorted key order; the guard reads them by name.
    from exporter.rewrites.onnx_gelu import replace_site
    from verifiers.formats.onnx.gelu_sites import find_gelu_sites

    exported = api.export(f"{KERAS}:{name}", to="onnx", opset=17, out=tmp_path / "m.onnx")
    assert exported.exit_code == 0 and exported.gelu_guard == "checked", exported.summary_lines()
    model = onnx.load(str(tmp_path / "m.onnx"))
    site = find_gelu_sites(model)[0]
    other = "exact" if site.claimed == "tanh" else "tanh"
    onnx.save(replace_site(model, site, other), tmp_path / "changed.onnx")
    report = api.verify(tmp_path / "changed.onnx", source=f"{KERAS}:{name}", atol=["1e-2"])
    assert report.exit_code == 3, report.summary_lines()
    assert [g["status"] for g in report.gelu] == ["changed", "kept"]


def test_a_keras_hub_length_the_tflite_converter_cannot_keep_dynamic_is_exit_4_naming_it(keras_hub_path, tmp_path):
    """Llama's None length needs FlexStridedSlice when dynamic: exit 4 naming the dynamic axes and
    the way out (fixed sizes through --input, which the zoo cell takes and then verifies)."""
    report = api.export(zoo.spec("keras", "hub_llama"), to="tflite", out=tmp_path / "m.tflite")
    assert report.exit_code == 4, report.summary_lines()
    [finding] = report.failures
    assert "FlexStridedSlice" in finding.message and "token_ids axis 1" in finding.message
    assert "fix their sizes with --input" in finding.message
    assert not (tmp_path / "m.tflite").exists()
