"""export of a tiny BERT to ONNX with dynamic batch and sequence, verified at four sizes of each,
beside the hand-written script that makes the same export (TorchScript, the same dynamic axes)
and verifies it at the export size only; and beside exportgate's export of the same model with
static shapes.

    python bench/dynamic_bert.py [--rounds 3]

Goal (issue 21): wall <= 1.3x the same export verified at one size.
"""

import argparse
import sys
import tempfile
from pathlib import Path

from side_by_side import EXPORTGATE, REPO, compare

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()
model = str(REPO / "bench" / "models.py") + ":bert_tiny"
AXES = ["--dynamic", "input_ids:0", "--dynamic", "input_ids:1", "--dynamic", "attention_mask:0",
        "--dynamic", "attention_mask:1"]
LABEL = "exportgate export, dynamic, 4 sizes each"
with tempfile.TemporaryDirectory() as tmp:
    export = [*EXPORTGATE, "export", model, "--to", "onnx", "--opset", "17", "--exporter", "torchscript"]
    compare([
        (LABEL, [*export, *AXES, "--out", f"{tmp}/dynamic/bert.onnx"],
         "hand-written, dynamic, export size only",
         [sys.executable, str(REPO / "bench/handwritten/torch_to_onnx.py"), model, f"{tmp}/bert.onnx", "--dynamic"]),
        (LABEL, [*export, *AXES, "--out", f"{tmp}/dynamic/bert.onnx"],
         "exportgate export, static shapes", [*export, "--out", f"{tmp}/static/bert.onnx"]),
    ], args.rounds, Path(tmp), goals={LABEL: (1.3, 1.3)})
