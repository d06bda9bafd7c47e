"""Progress on the terminal: rich's live step and bar on a terminal (the GELU probes counted as
they run in the worker), timestamped lines in a log, nothing with --quiet."""

import json
import os
import pty
import re
import sys

from fixtures.specs import torch_model
from fixtures.children import start_child

STEP_LINE = re.compile(r"^exportgate: \d\d:\d\d:\d\d \S")


def test_a_log_gets_one_timestamped_line_per_step_and_quiet_gets_none(cli):
    logged = cli("export", torch_model("mlp_exact"), "--to", "onnx", "--opset", "17", "--out", "m.onnx")
    steps = [line for line in logged.stderr.splitlines() if line.startswith("exportgate: ")]
    assert logged.returncode == 0 and len(steps) >= 5 and all(STEP_LINE.match(line) for line in steps), steps
    assert any("running the artifact on 4 batch(es)" in line for line in steps)
    quiet = cli("export", torch_model("mlp_exact"), "--to", "onnx", "--opset", "17", "--out", "q.onnx", "--quiet",
                "--json")
    assert quiet.returncode == 0 and not any(STEP_LINE.match(line) for line in quiet.stderr.splitlines())
    assert quiet.stderr.startswith("PASS ") and json.loads(quiet.stdout)["verdict"] == "pass"


def test_a_terminal_gets_the_step_and_a_bar_of_the_gelu_probes(tmp_path):
    controller, terminal = pty.openpty()
    process = start_child(
        [sys.executable, "-c", "from exporter.cli import console_main; console_main()", "export", torch_model("mlp_exact"), "--to",
         "onnx", "--opset", "17", "--out", "m.onnx"], stdin=terminal, stdout=terminal, stderr=terminal, cwd=tmp_path,
        env={"TERM": "xterm-256color", "COLUMNS": "140"})
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 1 << 16)
        except OSError:  # the terminal closed: the process is done
            break
        if not chunk:
            break
        shown += chunk
    assert process.wait(timeout=600) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.decode(errors="replace"))
    assert "exportgate: finding the GELU sites of the source and measuring the artifact's" in text
    assert re.search(r"━+ 1/1 ", text)  # mlp_exact's one GELU site, probed in the worker
    assert not STEP_LINE.search(text) and "PASS " in text
