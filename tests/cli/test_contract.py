"""The CLI contract: exit codes, one-line errors, files on disk, report fields."""

import json

import onnx
import pytest

from fixtures.specs import torch_model
from tests.conftest import REPO


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("exportgate: error") or "Traceback" in line]


def test_export_pass_writes_artifact_and_report(cli, tmp_path):
    result = cli("export", torch_model("mlp_exact"), "--to", "onnx", "--opset", "17",
                 "--out", "dist/m.onnx", "--report", "dist/m.json")
    assert result.returncode == 0, result.stderr
    assert "PASS dist/m.onnx" in result.stderr
    report = json.loads((tmp_path / "dist/m.json").read_text())
    assert report["verdict"] == "pass" and report["exit_code"] == 0
    assert report["requested_opset"] == report["actual_opset"] == 17
    assert report["artifact"]["format"] == "onnx" and len(report["artifact"]["sha256"]) == 64
    output = report["outputs"][0]
    assert set(output) >= {"name", "shape", "max_abs_err", "max_rel_err", "atol", "rtol", "passed"}
    assert output["atol"] == 1e-4 and output["rtol"] == 1e-3
    assert set(report["timings"]) >= {"load_source", "reference", "export", "load_artifact", "run_artifact"}
    assert report["versions"]["onnxruntime"] and report["seed"] == 0


def test_artifact_that_differs_is_exit_1_and_nothing_at_out(cli, tmp_path):
    # Tracing bakes in one branch; random batches take the other one.
    result = cli("export", torch_model("sign_branch"), "--to", "onnx", "--opset", "17",
                 "--out", "dist/m.onnx", "--report", "reports/m.json")
    assert result.returncode == 1, result.stderr
    assert not (tmp_path / "dist/m.onnx").exists()
    assert list((tmp_path / "dist").iterdir()) == []
    rejected = tmp_path / "reports/m.onnx.rejected"
    onnx.checker.check_model(str(rejected))
    report = json.loads((tmp_path / "reports/m.json").read_text())
    assert report["verdict"] == "fail" and report["rejected_artifact"] == str(rejected.relative_to(tmp_path))
    # The GELU guard reads the branch the sample takes, which the export traced: the GELU is kept.
    assert [f["kind"] for f in report["failures"]] == ["numeric"]
    assert [g["status"] for g in report["gelu"]] == ["kept"]


def test_rejected_artifact_keeps_its_external_data(cli, tmp_path):
    result = cli("export", torch_model("block_exact"), "--to", "onnx", "--opset", "18", "--out", "dist/b.onnx",
                 "--atol", "0", "--rtol", "0")
    assert result.returncode == 1
    rejected = tmp_path / "dist/b.onnx.rejected"
    assert (tmp_path / "dist/b.onnx.rejected.data").exists()
    assert not (tmp_path / "dist/b.onnx").exists() and not (tmp_path / "dist/b.onnx.data").exists()
    onnx.checker.check_model(str(rejected), full_check=True)


def test_stale_artifact_at_out_is_removed_on_failure(cli, tmp_path):
    (tmp_path / "m.onnx").write_bytes(b"an older release")
    result = cli("export", torch_model("sign_branch"), "--to", "onnx", "--opset", "17", "--out", "m.onnx")
    assert result.returncode == 1
    assert not (tmp_path / "m.onnx").exists()


def test_verify_against_other_weights_is_exit_1(cli, tmp_path):
    assert cli("export", torch_model("mlp_exact"), "--to", "onnx", "--opset", "18", "--out", "m.onnx").returncode == 0
    result = cli("verify", "m.onnx", "--source", torch_model("mlp_exact_other_weights"), "--report", "v.json")
    assert result.returncode == 1
    report = json.loads((tmp_path / "v.json").read_text())
    assert report["failures"][0]["kind"] == "numeric"
    assert report["outputs"][0]["max_abs_err"] > 0.01 and not report["outputs"][0]["passed"]


def test_verify_source_without_inputs_uses_the_artifacts(cli, tmp_path):
    assert cli("export", torch_model("mlp_exact"), "--to", "onnx", "--opset", "17", "--out", "m.onnx").returncode == 0
    result = cli("verify", "m.onnx", "--source", torch_model("mlp_without_inputs"))
    assert result.returncode == 0, result.stderr


def test_opset_the_exporter_cannot_honour_is_exit_4(cli):
    result = cli("export", torch_model("block_exact"), "--to", "onnx", "--opset", "13", "--exporter", "dynamo",
                 "--out", "m.onnx")
    assert result.returncode == 4
    assert "[opset] asked for opset 13" in result.stderr


def test_corrupt_onnx_is_exit_2_in_one_line(cli, tmp_path):
    assert cli("export", torch_model("mlp_exact"), "--to", "onnx", "--opset", "17", "--out", "m.onnx").returncode == 0
    (tmp_path / "bad.onnx").write_bytes((tmp_path / "m.onnx").read_bytes()[:200])
    for args in (("verify", "bad.onnx", "--source", torch_model("mlp_exact")), ("inspect", "bad.onnx")):
        result = cli(*args)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        assert "bad.onnx: not a readable ONNX model" in result.stderr


@pytest.mark.parametrize("spec, message", [
    (f"{torch_model('missing_builder')}", "no callable named 'missing_builder'"),
    ("nowhere.py:build", "nowhere.py: no such file"),
    ("model.bin", "model.bin: no such file"),
])
def test_bad_model_spec_is_exit_2_in_one_line(cli, spec, message):
    result = cli("export", spec, "--to", "onnx", "--opset", "17", "--out", "m.onnx")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1:] == [line for line in result.stderr.splitlines() if "error" in line]
    assert result.stderr.splitlines()[-1].startswith("exportgate: error: ") and message in result.stderr


def test_source_files_under_the_working_directory_are_named_relative_to_it(cli, tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mlp.py").write_text((REPO / "examples" / "mlp.py").read_text())
    result = cli("export", "models/mlp.py:build", "--to", "onnx", "--out", "m.onnx", "--report", "r.json")
    assert result.returncode == 0, result.stderr
    listed = json.loads((tmp_path / "r.json").read_text())["source_files"]
    assert [entry["path"] for entry in listed] == ["models/mlp.py"]


def test_an_error_in_the_users_code_names_their_line(cli, tmp_path):
    """The innermost frame in the user's own files, however deep in a library the error was raised;
    EXPORTGATE_DEBUG=1 adds the traceback."""
    (tmp_path / "helper.py").write_text(
        "import torch\n\n\ndef helper():\n    return torch.nn.Linear(4, 2)(torch.ones(3, 5))\n\n\n"
        "def build():\n    return helper()\n\n\n"
        "class Cut(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 2)\n\n    def forward(self, x):\n        return self.fc(x[:, :3])\n\n\n"
        "def cut():\n    return Cut(), (torch.ones(2, 4),)\n")
    lines = (tmp_path / "helper.py").read_text().splitlines()
    for spec, code in (("helper.py:build", "torch.ones(3, 5)"), ("helper.py:cut", "x[:, :3]")):
        line = next(k for k, text in enumerate(lines, 1) if code in text)
        result = cli("export", spec, "--to", "onnx", "--out", "m.onnx")
        assert result.returncode == 2
        assert result.stderr.splitlines()[-1].endswith(f"(at helper.py:{line})"), result.stderr
        assert "Traceback" not in result.stderr
    result = cli("export", "helper.py:cut", "--to", "onnx", "--out", "m.onnx", env={"EXPORTGATE_DEBUG": "1"})
    assert result.returncode == 2 and "Traceback (most recent call last)" in result.stderr


def test_a_run_that_never_compared_is_not_verified(tmp_path):
    from exporter import api

    exported = api.export(torch_model("mlp_exact"), to="onnx", out=tmp_path / "m.onnx")
    assert exported.exit_code == 0 and exported.verified
    report = api.verify(tmp_path / "m.onnx", source=str(tmp_path / "missing.py:build"))
    assert report.exit_code == 2 and report.verified is False


def test_bad_input_spec_is_exit_2(cli):
    result = cli("export", torch_model("mlp_exact"), "--to", "onnx", "--out", "m.onnx", "--input", "x:4by16:float32")
    assert result.returncode == 2
    assert "expected NAME:SHAPE:DTYPE" in result.stderr


def test_missing_framework_names_the_pip_command(cli):
    result = cli("export", torch_model("mlp_exact"), "--to", "onnx", "--out", "m.onnx",
                 prelude="import sys; sys.modules['torch'] = None")
    assert result.returncode == 2
    assert "pip install 'exportgate[torch]'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("spec, ranges", [
    (REPO / "examples" / "mlp.py:build", ["torch -> onnx writes opsets 7 to 25", "keras -> onnx writes opsets 7 to"]),
    ("model.pt2", ["torch -> onnx writes opsets 7 to 25"]),
])
def test_an_opset_no_route_writes_is_refused_before_anything_loads(cli, tmp_path, spec, ranges):
    """The framework is not imported (a .pt2 names it by its suffix; a callable's could be either),
    and the refusal names the range of each route it could take."""
    (tmp_path / "model.pt2").write_bytes(b"")
    result = cli("export", spec, "--to", "onnx", "--opset", "99", "--out", "m.onnx", "--report", "r.json",
                 prelude="import sys; sys.modules['torch'] = sys.modules['tensorflow'] = None")
    assert result.returncode == 4, result.stderr
    message = json.loads((tmp_path / "r.json").read_text())["failures"][0]["message"]
    assert message.startswith("--opset 99: ") and all(r in message for r in ranges), message
    assert message.endswith("ask for one of those")
    result = cli("export", spec, "--to", "tflite", "--opset", "17", "--out", "m.tflite",
                 prelude="import sys; sys.modules['torch'] = sys.modules['tensorflow'] = None")
    assert result.returncode == 2 and "tflite has none (leave --opset out)" in result.stderr


def test_the_dynamo_routes_highest_opset_is_onnxscripts():
    from onnxscript.version_converter import _version_converter

    from exporter.routes.torch_onnx import DYNAMO_MAX_OPSET

    assert DYNAMO_MAX_OPSET == _version_converter.SUPPORTED_MAX_ONNX_OPSET


@pytest.mark.parametrize("command", ["export", "verify", "check", "run", "plan", "merge", "targets", "inspect"])
def test_help_reads_at_80_columns(cli, command):
    """Where CI shows it (a pipe, 80 columns): no line past the width, and every option's syntax
    whole on its line."""
    import typer.main

    from exporter.cli import app

    result = cli(command, "--help", env={"COLUMNS": "80"})
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    for param in typer.main.get_command(app).commands[command].params:
        if param.param_type_name == "option" and not param.is_flag:
            syntax = f"{param.opts[0]} {param.metavar}"
            assert any(line.strip().startswith(syntax) for line in lines), (syntax, result.stdout)


def test_usage_error_is_exit_2(cli):
    assert cli("export").returncode == 2
    assert cli("frobnicate").returncode == 2


def test_no_verify_says_so(cli, tmp_path):
    result = cli("export", torch_model("sign_branch"), "--to", "onnx", "--opset", "17", "--out", "m.onnx",
                 "--no-verify", "--report", "r.json")
    assert result.returncode == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verified"] is False and report["outputs"] == []
    assert "not verified" in result.stderr


def test_per_output_tolerance(cli, tmp_path):
    result = cli("export", torch_model("keyword_inputs"), "--to", "onnx", "--opset", "17", "--out", "m.onnx",
                 "--atol", "logits=0", "--rtol", "logits=0", "--report", "r.json")
    report = json.loads((tmp_path / "r.json").read_text())
    [logits] = report["outputs"]
    assert logits["name"] == "logits" and logits["atol"] == 0 and logits["rtol"] == 0
    # With no tolerance the output passes exactly when the artifact matches bit for bit, and the
    # exit code follows the output's verdict.
    assert logits["passed"] == (logits["max_abs_err"] == 0)
    assert result.returncode == (0 if logits["passed"] else 1), result.stderr
    unknown = cli("export", torch_model("keyword_inputs"), "--to", "onnx", "--opset", "17", "--out", "m.onnx",
                  "--atol", "nosuch=1e-3")
    assert unknown.returncode == 2 and "unknown output(s) nosuch" in unknown.stderr


def test_inspect_does_not_import_torch_or_tensorflow(cli, tmp_path):
    assert cli("export", torch_model("block_exact"), "--to", "onnx", "--opset", "20", "--out", "m.onnx").returncode == 0
    probe = "import atexit, sys; atexit.register(lambda: print(sorted(m for m in ('torch', 'tensorflow', 'keras') if m in sys.modules), file=sys.stderr))"
    text = cli("inspect", "m.onnx", prelude=probe)
    assert text.returncode == 0
    assert "Gelu: 1" in text.stdout and "external data: m.onnx.data" in text.stdout
    assert text.stderr.strip().endswith("[]")
    as_json = cli("inspect", "m.onnx", "--json")
    info = json.loads(as_json.stdout)
    assert info["opset"] == 20 and info["inputs"][0]["shape"] == [2, 8, 32] and info["op_counts"]["Gelu"] == 1


# The runtime itself included: inspect reads the file in its own process and runs only the GELU
# probes, in a runtime worker; measure runs the artifact in workers alone; check needs no runtime.
UNUSED_ON_AN_ONNX_FILE = ("exporter.routes.torch_onnx", "exporter.routes.keras_onnx", "exporter.routes.keras_tflite",
                          "exporter.routes.torch_tflite", "exporter.frameworks.torch_framework",
                          "exporter.frameworks.keras_framework", "verifiers.runtimes.litert_runner", "onnxruntime")


def test_inspect_check_and_measure_import_no_route_framework_or_format_they_do_not_use(cli, tmp_path):
    assert cli("export", torch_model("mlp_exact"), "--to", "onnx", "--opset", "17", "--out", "m.onnx").returncode == 0
    # check reads the whole target matrix, whose TFLite entries the TFLite format validates.
    for args, unused in ((("inspect", "m.onnx"), UNUSED_ON_AN_ONNX_FILE + ("verifiers.formats.tflite",)),
                         (("check", "m.onnx", "--target", "ort-1.32"), UNUSED_ON_AN_ONNX_FILE),
                         (("measure", "m.onnx", "--measure-seconds", "0.05"),
                          UNUSED_ON_AN_ONNX_FILE + ("torch", "tensorflow", "verifiers.formats.tflite"))):
        probe = ("import atexit, sys; atexit.register(lambda: print(sorted(m for m in "
                 f"{unused!r} if m in sys.modules), file=sys.stderr))")
        result = cli(*args, prelude=probe)
        assert result.returncode == 0, result.stderr
        assert result.stderr.strip().endswith("[]"), result.stderr


def test_help_does_not_import_torch_or_tensorflow(cli):
    probe = "import atexit, sys; atexit.register(lambda: print(sorted(m for m in ('torch', 'tensorflow', 'keras') if m in sys.modules), file=sys.stderr))"
    result = cli("--help", prelude=probe)
    assert result.returncode == 0 and "export" in result.stdout
    assert result.stderr.strip().endswith("[]")


def test_the_process_ends_once_its_exit_handlers_ran_and_its_output_is_out(tmp_path):
    """The `exportgate` process skips the interpreter's teardown, but not what a program relies on at
    exit: its code, every byte it printed, threads that are not daemons finished, exit handlers run."""
    from fixtures.children import run_cli

    prelude = (
        "import atexit, pathlib, threading, time\n"
        "atexit.register(pathlib.Path('handler').write_text, 'ran')\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), pathlib.Path('thread').write_text('done'))).start()\n"
        "class Kept:\n"
        "    def __del__(self):\n"
        "        pathlib.Path('teardown').write_text('ran')\n"
        "kept = Kept()\n")
    listed = run_cli("targets", "--json", cwd=tmp_path, prelude=prelude)
    assert listed.returncode == 0, listed.stderr
    assert {target["name"] for target in json.loads(listed.stdout)} >= {"ort-1.16", "tflite-2.7"}
    assert (tmp_path / "handler").read_text() == "ran" and (tmp_path / "thread").read_text() == "done"
    assert not (tmp_path / "teardown").exists()  # the module's objects were not torn down one by one
    for made in ("handler", "thread"):
        (tmp_path / made).unlink()
    missing = run_cli("inspect", "missing.onnx", cwd=tmp_path, prelude=prelude)
    assert missing.returncode == 2 and missing.stderr.strip().splitlines()[-1].startswith("exportgate: error: ")
    assert (tmp_path / "handler").is_file() and (tmp_path / "thread").is_file()


def test_version(cli):
    from importlib import metadata

    result = cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"exportgate {metadata.version('exportgate')}"


# PyTorch's TFLite route (litert-torch) is the slow suite's; by default PyTorch's model talks in the
# TorchScript tracer of torch.onnx (opset 17).
@pytest.mark.parametrize(("builder", "route"), [("torch_gelu", ("onnx", "--opset", "17")),
                                                pytest.param("torch_gelu", ("tflite",), marks=pytest.mark.slow),
                                                ("keras_gelu", ("tflite",))], ids=["torch-onnx", "torch-tflite", "keras-tflite"])
def test_what_frameworks_print_and_log_while_exporting_shows_only_with_verbose(tmp_path, builder, route):
    """The model prints, logs a warning on its framework's logger and writes to descriptor 2 from
    native code, each time the export traces it: none of it reaches the terminal or stdout unless
    --verbose, and with --verbose all of it reaches stderr while stdout holds the report alone (a
    child process: what reaches its descriptors is what is tested)."""
    from fixtures.children import run_cli
    from fixtures.models.chatty_models import LOGGED, PRINTED, WRITTEN
    from fixtures.specs import MODELS

    def cli(*args):
        return run_cli(*args, cwd=tmp_path)

    args = ("export", f"{MODELS / 'chatty_models.py'}:{builder}", "--to", *route, "--out", f"m.{route[0]}", "--json")
    quiet = cli(*args)
    assert quiet.returncode == 0, quiet.stderr
    assert json.loads(quiet.stdout)["verdict"] == "pass"
    assert all(line.startswith(("exportgate: ", "PASS ", "  ")) for line in quiet.stderr.splitlines()), quiet.stderr
    loud = cli("--verbose", *args)
    assert loud.returncode == 0, loud.stderr
    assert json.loads(loud.stdout)["verdict"] == "pass"
    assert PRINTED in loud.stderr and LOGGED in loud.stderr and WRITTEN in loud.stderr, loud.stderr


def test_a_dynamic_axis_past_the_inputs_rank_is_exit_2(cli):
    result = cli("export", torch_model("mlp_exact"), "--to", "onnx", "--out", "m.onnx", "--dynamic", "input:99")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == "exportgate: error: --dynamic input:99: input has 2 axes (0 to 1)"
