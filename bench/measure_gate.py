"""The regression gate (`exportgate measure --baseline`), on this machine as it is: no false alarm,
and a deliberate slow-down caught with the op types that grew.

    python bench/measure_gate.py [--repeats 10] [--threads 2] [--against report|artifact]

An MLP (bench/models.py: gate_mlp, [64, 128] -> 512 -> 128, exact GELU) is exported to ONNX and
measured once into a baseline report; then measured `--repeats` times against that baseline at
the default --max-regression 10% (each an exit 0 expected: a false alarm is exit 5); then two
slow-downs of it are measured against the same baseline, each expected as exit 5: its hidden
layer 4 times wider (gate_mlp_wide), and its GELU written out as erf, Mul and Add 8 times
(gate_mlp_gelu_x8). `--against artifact` gives the baseline as the artifact itself
(--baseline-artifact, measured in turn in the same run) instead of its report.
"""

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from side_by_side import EXPORTGATE, REPO, run_once

parser = argparse.ArgumentParser()
parser.add_argument("--repeats", type=int, default=10)
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--against", choices=("report", "artifact"), default="report")
args = parser.parse_args()
models = str(REPO / "bench" / "models.py")


def measure(path: Path, *options: str) -> dict:
    done = subprocess.run([*EXPORTGATE, "measure", str(path), "--threads", str(args.threads), "--json", "--quiet",
                           *options], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    report = json.loads(done.stdout)
    assert report["exit_code"] == done.returncode
    return report


def line(name: str, report: dict) -> str:
    first = report["measurement"]["timings"][0]
    said = "; ".join(f["message"] for f in report["failures"]) or "; ".join(
        n for n in report.get("notes", []) if n.startswith(("latency", "baseline"))) or "-"
    return (f"{name:26} exit {report['exit_code']}  median {first['median_ms']:.3f} ms "
            f"[{first['low_ms']:.3f}, {first['high_ms']:.3f}]  {said}")


with tempfile.TemporaryDirectory() as tmp:
    folder = Path(tmp)
    for name in ("gate_mlp", "gate_mlp_wide", "gate_mlp_gelu_x8"):
        run_once([*EXPORTGATE, "export", f"{models}:{name}", "--to", "onnx", "--opset", "17", "--exporter",
                  "torchscript", "--out", str(folder / f"{name}.onnx"), "--no-verify"], folder)
    base = measure(folder / "gate_mlp.onnx", "--report", str(folder / "base.json"))
    print(line("baseline", base))
    against = (("--baseline", str(folder / "base.json")) if args.against == "report"
               else ("--baseline-artifact", str(folder / "gate_mlp.onnx")))
    alarms = 0
    for k in range(args.repeats):
        again = measure(folder / "gate_mlp.onnx", *against)
        alarms += again["exit_code"] == 5
        print(line(f"the same, run {k + 1}", again))
    print(f"false alarms: {alarms} of {args.repeats}")
    for name in ("gate_mlp_wide", "gate_mlp_gelu_x8"):
        slower = measure(folder / f"{name}.onnx", *against)
        print(line(name, slower), "" if slower["exit_code"] == 5 else "  NOT CAUGHT")
