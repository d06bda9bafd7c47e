"""export --target and the --gelu policies: the artifact fits the target, and every GELU keeps the
source's flavour by measurement (or changes as declared)."""

import json

import onnx
import pytest
import yaml

from exporter import api
from fixtures.specs import keras_model, torch_model
from verifiers.onnx_model import iter_nodes
from verifiers.tflite_model import load_tflite


def _ops(path):
    return {n.op_type for n in iter_nodes(onnx.load(str(path), load_external_data=False).graph)}


@pytest.mark.parametrize("target, opset, gelu_op", [
    ("ort-1.16", 19, False), ("tensorrt-8.6", 17, False), ("ort-1.17", 20, True), ("ort-1.32", 20, True),
])
@pytest.mark.parametrize("model", ["mlp_exact", "block_tanh"])
def test_preserve_fits_the_target_and_keeps_the_flavour(tmp_path, model, target, opset, gelu_op):
    out = tmp_path / "m.onnx"
    report = api.export(torch_model(model), to="onnx", target=target, out=out)
    assert report.exit_code == 0, report.summary_lines()
    assert report.actual_opset == opset and report.target_checks == []
    assert [g["status"] for g in report.gelu] == ["kept"]
    assert ("Gelu" in _ops(out)) is gelu_op


def test_preserve_fuses_chains_into_gelu_for_a_gelu_20_target(tmp_path):
    # A hand-written tanh formula stays a chain at every opset; for a Gelu-20 target it becomes one Gelu.
    _write_gelu_new(tmp_path)
    out = tmp_path / "m.onnx"
    report = api.export(f"{tmp_path / 'gelu_new.py'}:build", to="onnx", target="ort-1.32", out=out)
    assert report.exit_code == 0, report.summary_lines()
    assert "Gelu" in _ops(out) and "Tanh" not in _ops(out)
    assert any("fused into Gelu-20" in note for note in report.notes)
    assert [(g["status"], g["source_op"], g["op"]) for g in report.gelu] == [("kept", "tanh-chain", "Gelu")]


def _write_gelu_new(folder):
    (folder / "gelu_new.py").write_text(
        "import math\nimport torch\n\n\n"
        "class GeluNew(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))\n\n\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(8, 8), GeluNew()), (torch.randn(2, 8),)\n")


def test_a_target_without_erf_gets_the_erf_free_form(tmp_path):
    matrix = tmp_path / "targets.yaml"
    no_erf = {
        "format": "onnx", "runtime": "some-npu", "version": "1", "max_opset": 17,
        "gelu": {"gelu_op": False, "erf": False, "contrib_gelu": False},
        "sources": [{"fact": f, "source": "vendor sheet", "quote": "..."}
                    for f in ("max_opset", "gelu.gelu_op", "gelu.erf", "gelu.contrib_gelu")],
    }
    matrix.write_text(yaml.safe_dump({"schema": 1, "targets": {"npu-1": no_erf}}))
    out = tmp_path / "m.onnx"
    report = api.export(torch_model("mlp_exact"), to="onnx", target="npu-1", matrix=matrix, out=out)
    assert report.exit_code == 0, report.summary_lines()
    assert "Erf" not in _ops(out) and "Exp" in _ops(out)
    assert [(g["status"], g["measured"]) for g in report.gelu] == [("kept", "exact")]


def test_gelu_tanh_is_declared_not_failed(tmp_path):
    report = api.export(torch_model("mlp_exact"), to="onnx", opset=17, gelu="tanh", out=tmp_path / "m.onnx")
    assert report.exit_code == 0, report.summary_lines()
    [entry] = report.gelu
    assert (entry["status"], entry["source_flavour"], entry["measured"]) == ("declared", "exact", "tanh")
    # the summary says what became of the GELU: changed as asked, not kept
    lines = report.summary_lines()
    assert "  1 GELU site(s) changed as declared (exact to tanh)" in lines, lines
    assert not any("keep their flavour" in line for line in lines), lines


def test_gelu_native_where_the_target_has_none_is_exit_4(tmp_path):
    report = api.export(torch_model("mlp_exact"), to="onnx", target="ort-1.16", gelu="native", out=tmp_path / "m.onnx")
    assert report.exit_code == 4
    assert report.failures[0].message == ("--gelu native: opset 19 has no Gelu op; it is in the default domain "
                                          "from opset 20 (--opset 20); ort-1.16 loads opsets up to 19")
    pinned = api.export(torch_model("mlp_exact"), to="onnx", target="ort-1.32", opset=17, gelu="native",
                        out=tmp_path / "p.onnx")
    assert pinned.exit_code == 4 and pinned.failures[0].message.startswith("--gelu native: opset 17 has no Gelu op")
    tflite = api.export(keras_model("functional_activation"), to="tflite", target="tflite-2.9-gpu", gelu="native",
                        out=tmp_path / "m.tflite")
    assert tflite.exit_code == 4 and "does not run the GELU builtin" in tflite.failures[0].message


def test_opset_above_the_target_is_exit_4(tmp_path):
    report = api.export(torch_model("mlp_exact"), to="onnx", target="ort-1.16", opset=20, out=tmp_path / "m.onnx")
    assert report.exit_code == 4 and report.failures[0].kind == "opset"


def test_target_of_another_format_is_exit_2(tmp_path):
    report = api.export(torch_model("mlp_exact"), to="onnx", target="tflite-2.9", out=tmp_path / "m.onnx")
    assert report.exit_code == 2 and "runs tflite artifacts, not onnx" in report.failures[0].message


def test_malformed_matrix_names_the_entry_and_the_field(cli, tmp_path):
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"schema": 1, "targets": {"ort-9.9": {
        "format": "onnx", "runtime": "onnxruntime", "version": "9.9", "max_opset": "lots"}}}))
    result = cli("targets", "--matrix", "bad.yaml")
    assert result.returncode == 2
    assert "bad.yaml: target 'ort-9.9': field 'max_opset' must be an integer" in result.stderr
    assert "Traceback" not in result.stderr


def test_check_cli_flags_gelu_20_for_ort_1_16_and_passes_a_fitting_artifact(cli, tmp_path):
    # The exports make the artifacts check is given (their verification is other tests').
    assert cli("export", torch_model("mlp_exact"), "--to", "onnx", "--opset", "20", "--out", "g20.onnx",
               "--no-verify").returncode == 0
    flagged = cli("check", "g20.onnx", "--target", "ort-1.16", "--json")
    assert flagged.returncode == 4
    report = json.loads(flagged.stdout)
    assert {c["kind"] for c in report["target_checks"]} >= {"opset", "gelu"}
    assert cli("export", torch_model("mlp_exact"), "--to", "onnx", "--target", "ort-1.16",
               "--out", "fit.onnx", "--no-verify").returncode == 0
    assert cli("check", "fit.onnx", "--target", "ort-1.16").returncode == 0


def test_check_cli_flags_the_gelu_builtin_for_tflite_2_8_and_the_gpu_delegate(cli):
    assert cli("export", keras_model("functional_activation"), "--to", "tflite", "--out", "m.tflite",
               "--no-verify").returncode == 0
    for target in ("tflite-2.8", "tflite-2.9-gpu"):
        result = cli("check", "m.tflite", "--target", target)
        assert result.returncode == 4, result.stderr
        assert "[target]" in result.stderr
    assert cli("check", "m.tflite", "--target", "tflite-2.9").returncode == 0


def test_targets_cli_lists_sources_and_confirmations(cli):
    result = cli("targets", "--json")
    entries = {e["name"]: e for e in json.loads(result.stdout)}
    assert entries["ort-1.16"]["max_opset"] == 19 and entries["ort-1.16"]["max_ir_version"] == 9
    assert "max_opset" in entries["ort-1.16"]["confirmed_by_test"]
    assert all(e["sources"] for e in entries.values())


@pytest.mark.parametrize("target, gelu_op", [("ort-1.16", False), ("ort-1.32", True)])
def test_gelu_tanh_for_targets_with_and_without_gelu_20(tmp_path, target, gelu_op):
    out = tmp_path / "m.onnx"
    report = api.export(torch_model("block_exact"), to="onnx", target=target, gelu="tanh", out=out)
    assert report.exit_code == 0, report.summary_lines()
    assert [(g["status"], g["measured"]) for g in report.gelu] == [("declared", "tanh")]
    assert ("Gelu" in _ops(out)) is gelu_op and ("Tanh" in _ops(out)) is not gelu_op


def test_gelu_native_where_the_target_has_it(tmp_path):
    out = tmp_path / "m.onnx"
    report = api.export(torch_model("mlp_tanh"), to="onnx", target="ort-1.32", gelu="native", out=out)
    assert report.exit_code == 0, report.summary_lines()
    assert "Gelu" in _ops(out) and [g["status"] for g in report.gelu] == ["kept"]


@pytest.mark.parametrize("gelu", ["preserve", "tanh", "native"])
@pytest.mark.parametrize("target", ["tflite-2.9", "litert-2.3"])
def test_tflite_targets_with_the_gelu_builtin(tmp_path, target, gelu):
    out = tmp_path / "m.tflite"
    report = api.export(keras_model("functional_activation"), to="tflite", target=target, gelu=gelu, out=out)
    assert report.exit_code == 0, report.summary_lines()
    assert report.target_checks == []
    assert "GELU" in {code.name for code in load_tflite(out).opcodes}
    expected = ("declared", "tanh") if gelu == "tanh" else ("kept", "exact")
    assert [(g["status"], g["measured"]) for g in report.gelu] == [expected]


@pytest.mark.parametrize("gelu, expected", [("preserve", ("kept", "exact")), ("tanh", ("declared", "tanh"))])
def test_tflite_target_without_the_gelu_builtin(tmp_path, gelu, expected):
    out = tmp_path / "m.tflite"
    report = api.export(keras_model("functional_activation"), to="tflite", target="tflite-2.7", gelu=gelu, out=out)
    assert report.exit_code == 0, report.summary_lines()
    assert report.target_checks == []
    assert not {"GELU", "SIGN"} & {code.name for code in load_tflite(out).opcodes}
    assert [(g["status"], g["measured"]) for g in report.gelu] == [expected]


def test_gelu_tanh_still_fails_an_export_that_differs_for_another_reason(tmp_path):
    # Tracing bakes in one branch of sign_branch: the export differs from the model before any GELU
    # rewrite, and the declared change must not hide that.
    report = api.export(torch_model("sign_branch"), to="onnx", opset=17, gelu="tanh", out=tmp_path / "m.onnx")
    assert report.exit_code == 1 and report.gelu_guard == "checked"
    assert any(f.message.startswith("before the --gelu rewrite:") for f in report.failures if f.kind == "numeric")
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("to, plain, target", [("tflite", {}, "tflite-2.7"), ("onnx", {"opset": 20}, "ort-1.16")])
def test_what_check_says_to_run_makes_an_artifact_the_target_takes(tmp_path, to, plain, target):
    """A plain export's GELU (the TFLite builtin, Gelu-20) is refused by an older target, and the
    refusal names the export for it; that export is then taken."""
    plain_path = tmp_path / f"plain.{to}"
    assert api.export(torch_model("mlp_exact"), to=to, out=plain_path, **plain).exit_code == 0
    refused = api.check(plain_path, target=target)
    assert refused.exit_code == 4
    command = f"exportgate export MODEL --to {to} --target {target} writes one it takes"
    assert all(f.message.endswith(command) for f in refused.failures), [f.message for f in refused.failures]
    advised = tmp_path / f"advised.{to}"
    assert api.export(torch_model("mlp_exact"), to=to, target=target, out=advised).exit_code == 0
    assert api.check(advised, target=target).exit_code == 0
