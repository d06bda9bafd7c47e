"""export of a tiny BERT to ONNX with dynamic batch and sequence (verified at four sizes of each),
beside the same export with static shapes (verified at the export size only).

    python bench/dynamic_bert.py [--rounds 3] [--exporter torchscript|dynamo]

Goal (issue 21): wall <= 1.3x the export verified at one size.
"""

import argparse
import tempfile
from pathlib import Path

from side_by_side import EXPORTGATE, REPO, compare

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--exporter", default="torchscript")
args = parser.parse_args()
model = str(REPO / "bench" / "models.py") + ":bert_tiny"
AXES = ["--dynamic", "input_ids:0", "--dynamic", "input_ids:1", "--dynamic", "attention_mask:0",
        "--dynamic", "attention_mask:1"]
LABEL = "export, dynamic batch and sequence"
with tempfile.TemporaryDirectory() as tmp:
    common = ["export", model, "--to", "onnx", "--opset", "17", "--exporter", args.exporter]
    compare([(
        LABEL, [*EXPORTGATE, *common, *AXES, "--out", f"{tmp}/dynamic/bert.onnx"],
        "export, static shapes", [*EXPORTGATE, *common, "--out", f"{tmp}/static/bert.onnx"],
    )], args.rounds, Path(tmp), goals={LABEL: (1.3, 1.3)})
