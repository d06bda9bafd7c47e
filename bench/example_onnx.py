"""export of the bundled example (examples/mlp.py) to ONNX at opset 17, beside the hand-written
script: here the floor is mostly imports.

    python bench/example_onnx.py [--rounds 5]

Goal (issue 12): wall <= 1.15x and peak RSS <= 1.3x the hand-written script.
"""

import argparse
import tempfile
from pathlib import Path

from side_by_side import REPO, TORCH_ONNX, compare, torch_onnx_pair

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=5)
args = parser.parse_args()
model = str(REPO / "examples" / "mlp.py") + ":build"
with tempfile.TemporaryDirectory() as tmp:
    compare([torch_onnx_pair(model, tmp, "mlp.onnx")], args.rounds, Path(tmp),
            goals={TORCH_ONNX: (1.15, 1.3)})
