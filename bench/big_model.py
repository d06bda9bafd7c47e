"""export of a PyTorch MLP with about 2.6 GB of float32 weights to ONNX (external data), beside
the hand-written script; then verify of the exported file beside the script's load + batches, and
inspect of it.

    python bench/big_model.py [--rounds 1]

Goals (issue 12): the same ratios as bench/bert_onnx.py and bench/bert_verify.py (wall <= 1.15x,
peak RSS <= 1.3x).
"""

import argparse
import sys
import tempfile
from pathlib import Path

from side_by_side import EXPORTGATE, REPO, TORCH_ONNX, compare, run_once, torch_onnx_pair

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=1)
args = parser.parse_args()
model = str(REPO / "bench" / "models.py") + ":big_mlp"
with tempfile.TemporaryDirectory() as tmp:
    compare([torch_onnx_pair(model, tmp, "big.onnx", "--exporter", "torchscript")], args.rounds, Path(tmp),
            goals={TORCH_ONNX: (1.15, 1.3)})
    exported = f"{tmp}/gate/big.onnx"
    compare([("exportgate verify", [*EXPORTGATE, "verify", exported, "--source", model],
              "hand-written ORT load + batches",
              [sys.executable, str(REPO / "bench/handwritten/torch_to_onnx.py"), model, exported, "--verify-only"])],
            args.rounds, Path(tmp), goals={"exportgate verify": (1.15, 1.3)})
    wall, rss = run_once([*EXPORTGATE, "inspect", exported, "--json"], Path(tmp))
    print(f"inspect --json of the exported file: {wall:.2f} s, peak RSS {rss:.2f} GB")
