"""How long reading an artifact and measuring its GELU sites take (what `exportgate inspect` and
the GELU guard pay per artifact), without torch or TensorFlow in the reading process.

    python bench/inspect_speed.py [--repeat N]

Builds the artifacts first (torch.onnx and the TFLite converter, in a child process), then times,
in this process: the ONNX structure read, the .tflite parse, and the GELU inventory (find and
measure every site) of each.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD = """
import sys
from exporter import api
out = sys.argv[1]
for name, spec, to, opset in [
    ("block20.onnx", "fixtures/models/torch_models.py:block_exact", "onnx", 20),
    ("block17.onnx", "fixtures/models/torch_models.py:block_exact", "onnx", 17),
    ("convnext.tflite", "fixtures/models/keras_models.py:convnext_block", "tflite", None),
]:
    report = api.export(spec, to=to, opset=opset, out=f"{out}/{name}")
    assert report.exit_code == 0, report.summary_lines()
"""


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-c", BUILD, tmp], cwd=REPO, check=True, capture_output=True)
        from verifiers.formats.onnx.gelu_inventory import onnx_inventory
        from verifiers.formats.tflite.gelu_inventory import tflite_inventory
        from verifiers.onnx_model import describe as describe_onnx
        from verifiers.onnx_model import load_structure
        from verifiers.tflite_model import describe as describe_tflite

        rows = []
        for name in ("block20.onnx", "block17.onnx"):
            path = Path(tmp) / name
            rows.append((name, "describe", best_of(args.repeat, lambda: describe_onnx(path))))
            rows.append((name, "GELU inventory", best_of(args.repeat, lambda: onnx_inventory(load_structure(path).model))))
        path = Path(tmp) / "convnext.tflite"
        rows.append(("convnext.tflite", "describe", best_of(args.repeat, lambda: describe_tflite(path))))
        rows.append(("convnext.tflite", "GELU inventory", best_of(args.repeat, lambda: tflite_inventory(path))))
        heavy = sorted(m for m in ("torch", "tensorflow", "keras") if m in sys.modules)
    for artifact, step, seconds in rows:
        print(f"{artifact:16} {step:15} {seconds * 1000:8.2f} ms (best of {args.repeat})")
    print(f"torch/tensorflow/keras imported: {heavy or 'none'}")


if __name__ == "__main__":
    main()
