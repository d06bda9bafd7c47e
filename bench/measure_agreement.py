"""`exportgate measure` beside a hand-written timing loop over the same artifact, in turn, several
rounds: the median latency of each, and their ratio. The hand-written loop is what one would write
with the runtime alone: a session (onnxruntime) or an interpreter with its default XNNPACK delegate
(LiteRT), the same thread count, the same input shapes (`measure --input` is given the loop's),
3 warm-up runs, then 50 timed runs.

    python bench/measure_agreement.py [--rounds 3] [--threads 2]

Artifacts (exported by exportgate, not timed): BERT-base to ONNX (opset 17, one sequence of 128
tokens) and Keras MobileNetV2 (random weights) to TFLite. Goal (issue 37): the medians agree
within 10%.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from side_by_side import EXPORTGATE, REPO, run_once

HANDWRITTEN = {
    "onnx": """
import sys, time, statistics, numpy as np, onnxruntime as ort
options = ort.SessionOptions(); options.intra_op_num_threads = {threads}
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
feed = {{i.name: (np.zeros if "int" in i.type else np.ones)([d if isinstance(d, int) else 1 for d in i.shape],
         np.int64 if "int" in i.type else np.float32) for i in session.get_inputs()}}
""",
    "tflite": """
import sys, time, statistics, numpy as np
from ai_edge_litert.interpreter import Interpreter
interpreter = Interpreter(model_path=sys.argv[1], num_threads={threads})
runner = interpreter.get_signature_runner()
feed = {{name: np.ones(d["shape"], d["dtype"]) for name, d in runner.get_input_details().items()}}
session = type("S", (), {{"run": lambda self, _, f: runner(**f)}})()
""",
}
TIMING = """
print(" ".join(f"{name}:{'x'.join(map(str, value.shape))}:{value.dtype}" for name, value in feed.items()))
for _ in range(3):
    session.run(None, feed)
times = []
for _ in range(50):
    start = time.perf_counter(); session.run(None, feed); times.append(time.perf_counter() - start)
print(1000 * statistics.median(times))
"""


def measured(path: Path, threads: int, inputs: list[str]) -> float:
    """exportgate measure's median latency (ms) of the runtime's default way, on inputs of the shapes
    the hand-written loop fed (NAME:SHAPE:DTYPE)."""
    given = [word for spec in inputs for word in ("--input", spec)]
    out = subprocess.run([*EXPORTGATE, "measure", str(path), "--threads", str(threads), "--json", "--quiet", *given],
                         capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return json.loads(out.stdout)["measurement"]["timings"][0]["median_ms"]


def handwritten(path: Path, fmt: str, threads: int) -> tuple[float, list[str]]:
    """The hand-written loop's median latency (ms), and the shapes it fed."""
    code = HANDWRITTEN[fmt].format(threads=threads) + TIMING
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    return float(lines[-1]), lines[-2].split()


parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--threads", type=int, default=2)
args = parser.parse_args()
models = str(REPO / "bench" / "models.py")
with tempfile.TemporaryDirectory() as tmp:
    artifacts = {"BERT-base (ONNX)": (Path(tmp) / "bert.onnx", "onnx", [f"{models}:bert_base", "--to", "onnx",
                                                                        "--opset", "17", "--exporter", "torchscript"]),
                 "MobileNetV2 (TFLite)": (Path(tmp) / "mobilenet.tflite", "tflite",
                                          [f"{models}:keras_mobilenet_v2", "--to", "tflite"])}
    for path, _, export in artifacts.values():
        run_once([*EXPORTGATE, "export", *export, "--out", str(path), "--no-verify"], Path(tmp))
    print(f"{'artifact':22} {'exportgate measure':>19} {'hand-written':>13} {'ratio':>7}   (median ms, {args.threads} "
          f"threads, median of {args.rounds} rounds, in turn)")
    for name, (path, fmt, _) in artifacts.items():
        ours, theirs = [], []
        for _ in range(args.rounds):
            ms, fed = handwritten(path, fmt, args.threads)
            theirs.append(ms)
            ours.append(measured(path, args.threads, fed))
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"{name:22} {a:19.2f} {b:13.2f} {a / b:7.3f}   {'within' if abs(a / b - 1) <= 0.10 else 'OUTSIDE'} "
              f"10% (rounds: {', '.join(f'{x:.2f}/{y:.2f}' for x, y in zip(ours, theirs))})")
