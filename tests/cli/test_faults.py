"""Killed, interrupted, mistyped or raced runs: the report and the exit code agree, nothing
unverified is published or outlives the run, and a previous release is lost only to a run that
really exported and failed."""

import hashlib
import json
import signal
import sys
import time

import pytest

from fixtures.specs import torch_model
from fixtures.children import PIPE, run_cli, start_child

STALL_FOLDER_VARIABLE = "EXPORTGATE_TEST_STALL"  # fixtures.models.torch_models' (not imported: no torch here)


def _start(tmp_path, *args, stall=None):
    """`exportgate ARGS` in the background; `stall`: the folder a stalling fixture model
    (held_mlp, mlp_held_once_staged) says it stalled in, and waits in for a file `release`."""
    # Ctrl-C reaches exportgate as it does from a terminal, even when this suite runs where SIGINT
    # is ignored (a background job of a shell without job control), which a child inherits.
    code = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\nfrom exporter.cli import console_main\nconsole_main()"
    env = {}
    if stall is not None:
        stall.mkdir(exist_ok=True)
        env[STALL_FOLDER_VARIABLE] = str(stall)
    return start_child([sys.executable, "-c", code, *args], cwd=tmp_path, env=env, stderr=PIPE, text=True)


def _wait_until_stalled(process, stall, timeout=600):
    """Wait for `process` to reach its stall (its model writes stalled-PID in `stall`, then waits
    there until released or killed), however long its start-up takes; `timeout` only ends a broken
    test."""
    marker = stall / f"stalled-{process.pid}"
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if process.poll() is not None:
            raise AssertionError(f"exited {process.returncode} before it stalled: {process.stderr.read()}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"never stalled: {process.communicate()[1]}")
        time.sleep(0.05)


def _wait_for(process, text, timeout=300):
    """Read the run's progress lines until one holds `text`; returns what was read."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"never saw {text!r}: {''.join(seen)}")


def _release(tmp_path, shared_artifact):
    """A previous release at dist/m.onnx, with its data file (exported once for the whole run)."""
    shared_artifact(tmp_path / "dist", torch_model("mlp_tanh"), "m.onnx", to="onnx", opset=18)
    return {p.name: p.read_bytes() for p in (tmp_path / "dist").iterdir()}


def _files(tmp_path):
    return {p.name: p.read_bytes() for p in (tmp_path / "dist").iterdir()}


@pytest.mark.parametrize(("sig", "code", "word"), [(signal.SIGINT, 130, "interrupted"),
                                                     (signal.SIGTERM, 143, "terminated")])
def test_a_signal_mid_export_writes_a_report_that_says_so(tmp_path, shared_artifact, sig, code, word):
    before = _release(tmp_path, shared_artifact)
    stall = tmp_path / "stall"
    run = _start(tmp_path, "export", torch_model("held_mlp"), "--to", "onnx", "--opset", "17",
                 "--out", "dist/m.onnx", "--report", "r.json", stall=stall)
    _wait_until_stalled(run, stall)  # inside the export, which waits for the signal: it is never released
    run.send_signal(sig)
    log = run.stderr.read()
    assert run.wait(timeout=120) == code
    assert "exporting with" in log and log.strip().splitlines()[-1] == f"exportgate: {word} ({signal.Signals(sig).name})"
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["verdict"], report["exit_code"]) == ("fail", code)
    assert _files(tmp_path) == before  # the previous release stands; no staging folder is left


@pytest.mark.parametrize("options", [
    ["--atol", "abc"], ["--rtol", "-1"], ["--to", "tflight"], ["--exporter", "onnx2tf"], ["--quantize", "int3"],
    ["--gelu", "fast"], ["--dynamic", "x"], ["--input", "x:4by16:float32"], ["--opset", "0"],
    ["--report", "dist/m.onnx/r.json"],
])
def test_a_usage_error_leaves_the_previous_release_and_loads_nothing(tmp_path, shared_artifact, cli, options):
    before = _release(tmp_path, shared_artifact)
    marker = tmp_path / "loaded"
    builder = tmp_path / "builder.py"
    builder.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
                       f"from fixtures.models.torch_models import mlp_exact as build\n")
    result = cli("export", f"{builder}:build", "--to", "onnx", "--out", "dist/m.onnx", *options)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("exportgate: error: "), result.stderr
    assert not marker.exists()  # validated before the model loaded
    assert _files(tmp_path) == before


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--out", "dist", "is a folder"), ("--out", "afile/m.onnx", "is a file, not a folder"),
    ("--report", "afile/r.json", "is a file, not a folder")])
def test_paths_that_cannot_be_written_are_refused_first(tmp_path, cli, option, value, message):
    (tmp_path / "dist").mkdir()
    (tmp_path / "afile").write_text("")
    args = {"--out": "dist/m.onnx", "--report": "r.json"} | {option: value}
    result = cli("export", torch_model("mlp_exact"), "--to", "onnx", "--out", args["--out"],
                 "--report", args["--report"])
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
    assert list((tmp_path / "dist").iterdir()) == []


def test_an_unexpected_error_is_in_the_report_with_the_processes_exit_code(tmp_path):
    builder = tmp_path / "builder.py"
    builder.write_text("def build():\n    raise ZeroDivisionError('boom')\n")
    result = run_cli("export", f"{builder}:build", "--to", "onnx", "--out", "m.onnx", "--report", "r.json",
                     cwd=tmp_path)
    report = json.loads((tmp_path / "r.json").read_text())
    assert result.returncode == report["exit_code"] != 0
    assert report["verdict"] == "fail" and "boom" in json.dumps(report["failures"])


def test_a_killed_run_leaves_staging_that_the_next_run_sweeps(tmp_path):
    stall = tmp_path / "stall"
    run = _start(tmp_path, "export", torch_model("mlp_held_once_staged"), "--to", "onnx", "--opset", "17",
                 "--out", "dist/m.onnx", stall=stall)
    _wait_until_stalled(run, stall)  # the full unverified artifact is staged; the run waits there to be killed
    run.kill()
    run.wait(timeout=60)
    left = [p for p in (tmp_path / "dist").iterdir() if p.name.endswith(".staging")]
    assert len(left) == 1 and (left[0] / "m.onnx").exists()

    result = run_cli("export", torch_model("mlp_exact"), "--to", "onnx", "--opset", "17", "--out", "dist/m.onnx",
                     "--report", "r.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "dist").iterdir()) == ["m.onnx"]
    notes = json.loads((tmp_path / "r.json").read_text())["notes"]
    assert any("removed 1 staging folder(s) left by killed runs" in n for n in notes)


def test_two_exports_to_one_out_take_turns_and_the_report_matches_the_file(tmp_path):
    stall = tmp_path / "stall"
    first = _start(tmp_path, "export", torch_model("held_mlp"), "--to", "onnx", "--opset", "17",
                   "--out", "dist/m.onnx", "--report", "first.json", stall=stall)
    _wait_until_stalled(first, stall)  # mid-export, holding --out until the test releases it
    second = _start(tmp_path, "export", torch_model("mlp_tanh"), "--to", "onnx", "--opset", "17",
                    "--out", "dist/m.onnx", "--report", "second.json")
    try:
        seen = _wait_for(second, "waiting for another exportgate run writing dist/m.onnx")
    finally:
        (stall / "release").touch()  # only now, with the second run waiting, does the first go on
    log = "".join(seen) + second.communicate(timeout=600)[1]
    first.communicate(timeout=600)
    assert (first.returncode, second.returncode) == (0, 0), log
    assert "waiting for another exportgate run writing dist/m.onnx" in log
    published = hashlib.sha256((tmp_path / "dist" / "m.onnx").read_bytes()).hexdigest()
    reports = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in ("first", "second")}
    assert reports["second"]["artifact"]["sha256"] == published != reports["first"]["artifact"]["sha256"]
