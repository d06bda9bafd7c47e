"""`exportgate export FOLDER --to onnx --opset 17` of a tiny GPT-2 model folder (task
text-generation-with-past, inferred), beside bench/handwritten/decoder_with_past.py: the
optimum-style script that exports the same decoder with its KV cache and runs one greedy generate
loop in onnxruntime against transformers' generate. exportgate also verifies at several sizes of
each axis, generates step by step against transformers, guards the GELU sites and publishes the
folder's files beside the artifact.

    python bench/gpt2_with_past.py [--rounds 3]

Goal (issue 24): wall <= 1.3x the hand-written script; peak RSS <= 1.3x as for the other exports.
"""

import argparse
import sys
import tempfile
from pathlib import Path

from side_by_side import EXPORTGATE, REPO, compare, run_once

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()
with tempfile.TemporaryDirectory() as tmp:
    folder = f"{tmp}/gpt2"
    run_once([sys.executable, "-m", "fixtures.models.hf_folders", "gpt2-causal-lm", folder], REPO)
    compare([("exportgate export (with past)",
              [*EXPORTGATE, "export", folder, "--to", "onnx", "--opset", "17", "--out", f"{tmp}/gate/gpt2.onnx"],
              "hand-written export + ORT generate",
              [sys.executable, str(REPO / "bench/handwritten/decoder_with_past.py"), folder, f"{tmp}/gpt2.onnx"])],
            args.rounds, Path(tmp), goals={"exportgate export (with past)": (1.3, 1.3)})
