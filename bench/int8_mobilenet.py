"""int8 export of keras.applications MobileNetV2 (alpha 0.35, 224x224, random weights) to
TFLite and its verification, beside the hand-written script that quantizes it with
TFLiteConverter on the same calibration batches and checks it in both LiteRT interpreters.

    python bench/int8_mobilenet.py [--rounds 3] [--batches 8]

Goal (issue 22): wall <= 1.3x the hand-written script.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from side_by_side import EXPORTGATE, REPO, compare

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--batches", type=int, default=8, help="calibration batches of 2 images")
args = parser.parse_args()
model = str(REPO / "bench" / "models.py") + ":keras_mobilenet_v2"
LABEL = "exportgate export --quantize int8"

# The calibration folder both commands read: one .npz per batch of two seeded random images.
WRITE_CALIBRATION = f"""
import sys, numpy as np
sys.path.insert(0, {str(REPO / 'bench')!r})
from models import MOBILENET_SIZE, keras_mobilenet_v2
name = keras_mobilenet_v2().inputs[0].name
rng = np.random.default_rng(1)
for k in range({args.batches}):
    images = rng.standard_normal((2, MOBILENET_SIZE, MOBILENET_SIZE, 3)).astype(np.float32)
    np.savez(sys.argv[1] + f"/batch{{k:02d}}.npz", **{{name: images}})
"""

with tempfile.TemporaryDirectory() as tmp:
    calibration = Path(tmp) / "calibration"
    calibration.mkdir()
    subprocess.run([sys.executable, "-c", WRITE_CALIBRATION, str(calibration)], check=True)
    compare([(
        LABEL,
        [*EXPORTGATE, "export", model, "--to", "tflite", "--quantize", "int8", "--calibration", str(calibration),
         "--out", f"{tmp}/gate/mobilenet.tflite"],
        "hand-written TFLiteConverter int8 + LiteRT",
        [sys.executable, str(REPO / "bench/handwritten/keras_to_tflite_int8.py"), model, str(calibration),
         f"{tmp}/mobilenet.tflite"],
    )], args.rounds, Path(tmp), goals={LABEL: (1.3, 1.3)})
