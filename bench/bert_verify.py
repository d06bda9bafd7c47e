"""`exportgate verify` of BERT-base as ONNX (opset 17, weights inside the file; exported first by
exportgate, not timed), beside the hand-written load + session + batches of
bench/handwritten/torch_to_onnx.py --verify-only.

    python bench/bert_verify.py [--rounds 3]

Goal (issue 12): wall <= 1.15x the hand-written script.
"""

import argparse
import sys
import tempfile
from pathlib import Path

from side_by_side import EXPORTGATE, REPO, compare, run_once

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()
model = str(REPO / "bench" / "models.py") + ":bert_base"
with tempfile.TemporaryDirectory() as tmp:
    artifact = f"{tmp}/bert.onnx"
    run_once([*EXPORTGATE, "export", model, "--to", "onnx", "--opset", "17", "--exporter", "torchscript",
              "--out", artifact], Path(tmp))
    compare([(
        "exportgate verify",
        [*EXPORTGATE, "verify", artifact, "--source", model],
        "hand-written ORT load + batches",
        [sys.executable, str(REPO / "bench/handwritten/torch_to_onnx.py"), model, artifact, "--verify-only"],
    )], args.rounds, Path(tmp), goals={"exportgate verify": (1.15, 1.3)})
