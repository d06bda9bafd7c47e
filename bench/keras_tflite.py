"""export of a BERT-base-sized Keras encoder to TFLite, verified in both LiteRT interpreter
variants, beside the hand-written convert + two interpreters + batches.

    python bench/keras_tflite.py [--rounds 3]

Goal (issue 12): wall <= 1.3x the hand-written script.
"""

import argparse
import sys
import tempfile
from pathlib import Path

from side_by_side import EXPORTGATE, REPO, compare

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()
model = str(REPO / "bench" / "models.py") + ":keras_bert_sized"
with tempfile.TemporaryDirectory() as tmp:
    compare([(
        "exportgate export --to tflite",
        [*EXPORTGATE, "export", model, "--to", "tflite", "--out", f"{tmp}/gate/bert.tflite"],
        "hand-written TFLiteConverter + LiteRT",
        [sys.executable, str(REPO / "bench/handwritten/keras_to_tflite.py"), model, f"{tmp}/bert.tflite"],
    )], args.rounds, Path(tmp), goals={"exportgate export --to tflite": (1.3, 1.3)})
