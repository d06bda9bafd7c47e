"""A Llama decoder folder with about 5.1 GB of float32 weights (bench/models.py,
save_big_llama_folder: random, seeded), exported with its KV cache and verified by `exportgate
export FOLDER --to onnx`, beside bench/handwritten/decoder_with_past.py (the optimum-style export
with past and one ORT generate loop). Prints each one's wall time and peak RSS (process tree) and
the peak over the weight bytes.

    python bench/big_decoder.py [--rounds 1]

Goal (issue 24): exportgate's peak RSS <= 1.6x the weight bytes on this 24 GiB machine.
"""

import argparse
import sys
import tempfile
from pathlib import Path

from models import save_big_llama_folder
from side_by_side import EXPORTGATE, REPO, run_once

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=1)
args = parser.parse_args()
with tempfile.TemporaryDirectory() as tmp:
    folder = f"{tmp}/llama"
    weights = save_big_llama_folder(folder)
    print(f"weights: {weights / 1e9:.2f} GB of float32", flush=True)
    gate = [*EXPORTGATE, "export", folder, "--to", "onnx", "--out", f"{tmp}/gate/llama.onnx"]
    hand = [sys.executable, str(REPO / "bench/handwritten/decoder_with_past.py"), folder, f"{tmp}/hand/llama.onnx"]
    Path(f"{tmp}/hand").mkdir()
    for name, command in (("exportgate export (with past)", gate), ("hand-written export + ORT generate", hand)):
        for _ in range(args.rounds):
            wall, rss = run_once(command, Path(tmp))
            print(f"{name:40} {wall:8.2f}s {rss:7.2f}G  peak/weights {rss * 1e9 / weights:.2f}x", flush=True)
