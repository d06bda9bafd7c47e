"""export (with verification and the full GELU guard, default options) of BERT-base to ONNX at
opset 17 with the TorchScript exporter, beside the hand-written script that does the floor of it.

    python bench/bert_onnx.py [--rounds 3]

Goal (issue 12): wall <= 1.15x and peak RSS <= 1.3x the hand-written script.
"""

import argparse
import sys
import tempfile
from pathlib import Path

from side_by_side import EXPORTGATE, REPO, compare

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()
model = str(REPO / "bench" / "models.py") + ":bert_base"
with tempfile.TemporaryDirectory() as tmp:
    compare([(
        "exportgate export --to onnx --opset 17",
        [*EXPORTGATE, "export", model, "--to", "onnx", "--opset", "17", "--exporter", "torchscript",
         "--out", f"{tmp}/gate/bert.onnx"],
        "hand-written torch.onnx + ORT",
        [sys.executable, str(REPO / "bench/handwritten/torch_to_onnx.py"), model, f"{tmp}/bert.onnx"],
    )], args.rounds, Path(tmp), goals={"exportgate export --to onnx --opset 17": (1.15, 1.3)})
