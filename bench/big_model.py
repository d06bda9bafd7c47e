"""export of a PyTorch MLP with about 2.6 GB of float32 weights to ONNX (external data), beside
the hand-written script; then inspect of the result.

    python bench/big_model.py [--rounds 1]

Goals (issue 12): the same ratios as bench/bert_onnx.py (wall <= 1.15x, peak RSS <= 1.3x).
"""

import argparse
import sys
import tempfile
from pathlib import Path

from side_by_side import EXPORTGATE, REPO, compare, run_once

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=1)
args = parser.parse_args()
model = str(REPO / "bench" / "models.py") + ":big_mlp"
with tempfile.TemporaryDirectory() as tmp:
    compare([(
        "exportgate export --to onnx --opset 17",
        [*EXPORTGATE, "export", model, "--to", "onnx", "--opset", "17", "--exporter", "torchscript",
         "--out", f"{tmp}/gate/big.onnx"],
        "hand-written torch.onnx + ORT",
        [sys.executable, str(REPO / "bench/handwritten/torch_to_onnx.py"), model, f"{tmp}/big.onnx"],
    )], args.rounds, Path(tmp), goals={"exportgate export --to onnx --opset 17": (1.15, 1.3)})
    wall, rss = run_once([*EXPORTGATE, "inspect", f"{tmp}/big.onnx", "--json"], Path(tmp))
    print(f"inspect --json of the exported file: {wall:.2f} s, peak RSS {rss:.2f} GB")
