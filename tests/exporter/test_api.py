"""The API's commands as step lists: what one ONNX export and its verification read from disk."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO
from fixtures.specs import torch_model

# Reads of the staged m.onnx in one `export --to onnx` with verification and the full GELU guard
# (the default --gelu preserve without a target reads nothing):
#   exporter process: the route reading the opset it produced and the artifact object every later
#     step shares (both read the graph without its weights), the SHA-256 of the report;
#   runtime worker: the runner's external-data check (the graph), onnx.checker's full check, the
#     onnxruntime session, and one read of the graph that the GELU measuring (its probes) and the
#     GELU-swapped variant share (a variant of a model with weights over 4 KiB inside the file
#     opens it once more: its session reads those weights where they lie).
EXPORT_READS = 7


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace counts the file opens (.ci/run installs it)")
def test_an_onnx_export_and_its_verification_read_the_artifact_a_stated_number_of_times(tmp_path):
    trace = tmp_path / "trace.txt"
    code = "from exporter.cli import main; main()"
    result = subprocess.run(
        ["strace", "-f", "-e", "trace=openat,open", "-o", str(trace), sys.executable, "-c", code,
         "export", torch_model("mlp_exact"), "--to", "onnx", "--opset", "17", "--out", str(tmp_path / "out/m.onnx")],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    reads = [line for line in trace.read_text().splitlines()
             if re.search(r'\.staging/m\.onnx", O_RDONLY', line) and "ENOENT" not in line]
    assert len(reads) == EXPORT_READS, "\n".join(reads)
