"""The API's commands as step lists: what one ONNX export and its verification read from disk."""

import re
import shutil
import sys

from fixtures.children import run_child
from fixtures.specs import torch_model
from tests.conftest import tool_missing

# In an strace of `exportgate export` (-f, -s wide enough for a progress line), the lines that matter.
WORKER_START = re.compile(r"^(\d+) +execve\(.*verifiers\.runtimes\.isolation import serve")
PROGRESS = re.compile(r'^\d+ +write\(\d+, "exportgate: \d\d:\d\d:\d\d (.*?)\\n"')
STAGED_READ = re.compile(r'^(\d+) +open(?:at)?\(.*\.staging/m\.onnx", O_RDONLY')
PUBLISHED_READ = re.compile(r'out/m\.onnx", O_RDONLY')

# What exportgate reads the staged m.onnx for in the exporter process (the runtime worker's own
# loading, onnx.checker's and onnxruntime's, is theirs and not counted): the route checking the
# opset it produced, the one artifact object every later step shares, and the SHA-256 of the report.
EXPORTER_READS = 3


def test_an_onnx_export_reads_its_artifact_once_per_use_and_never_once_published(tmp_path):
    trace = tmp_path / "trace.txt"
    code = "from exporter.cli import console_main; console_main()"
    if shutil.which("strace") is None:
        tool_missing("strace counts the file opens (Debian's strace; .ci/run installs it)")
    result = run_child(
        ["strace", "-f", "-s", "200", "-e", "trace=openat,open,write,execve", "-e", "signal=none",
         "-o", str(trace), sys.executable, "-c", code,
         "export", torch_model("mlp_exact"), "--to", "onnx", "--opset", "17", "--out", "out/m.onnx"],
        cwd=tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr

    lines = [line for line in trace.read_text().splitlines() if "ENOENT" not in line]
    [worker] = [m[1] for m in map(WORKER_START.match, lines) if m]
    steps, reads = [""], []  # the exporter's progress steps; (who read the staged artifact, in which step)
    for line in lines:
        if progress := PROGRESS.match(line):
            steps.append(progress[1])
        elif staged := STAGED_READ.match(line):
            reads.append(("worker" if staged[1] == worker else "exporter", len(steps) - 1))
    [loading] = [i for i, s in enumerate(steps) if s.startswith("loading the artifact in")]
    [batches] = [i for i, s in enumerate(steps) if s.startswith("running the artifact on")]

    assert len([r for r in reads if r[0] == "exporter"]) <= EXPORTER_READS, reads
    # Once the artifact is loaded in its runtime, the batches run in that session, and the GELU
    # probes of every site and the GELU-swapped variant share one read of it.
    after_load = [i for who, i in reads if who == "worker" and i > loading]
    assert batches not in after_load and len(after_load) <= 1, (steps, reads)
    assert not [line for line in lines if PUBLISHED_READ.search(line)]  # moved there, never read back
