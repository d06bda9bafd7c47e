"""export (with verification and the full GELU guard, default options) of BERT-base to ONNX at
opset 17 with the TorchScript exporter, beside the hand-written script that does the floor of it.

    python bench/bert_onnx.py [--rounds 3]

Goal (issue 12): wall <= 1.15x and peak RSS <= 1.3x the hand-written script.
"""

import argparse
import tempfile
from pathlib import Path

from side_by_side import REPO, TORCH_ONNX, compare, torch_onnx_pair

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()
model = str(REPO / "bench" / "models.py") + ":bert_base"
with tempfile.TemporaryDirectory() as tmp:
    compare([torch_onnx_pair(model, tmp, "bert.onnx", "--exporter", "torchscript")], args.rounds, Path(tmp),
            goals={TORCH_ONNX: (1.15, 1.3)})
