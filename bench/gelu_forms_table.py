"""The seed table: what a BERT-base-sized model costs with its GELUs built in, written out as
primitives, and replaced by ReLU, in latency, throughput and peak memory, on ONNX and TFLite, by
`exportgate measure --gelu-forms` (the forms measured in turn with the artifact, 6 rounds each).

    python bench/gelu_forms_table.py [--seconds 3] [--threads 2]

Artifacts (exported by exportgate with --no-verify, not timed): BERT-base from its transformers
config to ONNX at opset 20 (torch.onnx writes each exact GELU as a Gelu op; one sequence of 128
tokens), and a BERT-base-sized Keras encoder (12 layers, hidden 768, GELU MLP of 3072, one sequence
of 128 float embeddings) to TFLite (TFLiteConverter writes the GELU builtin). Prints one Markdown
table.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from side_by_side import EXPORTGATE, REPO

MODELS = str(REPO / "bench" / "models.py")
ARTIFACTS = (
    ("BERT-base, ONNX opset 20 (onnxruntime)", f"{MODELS}:bert_base", "bert.onnx",
     ("--to", "onnx", "--opset", "20", "--exporter", "torchscript")),
    ("BERT-base-sized Keras encoder, TFLite (LiteRT)", f"{MODELS}:keras_bert_sized", "bert.tflite", ("--to", "tflite")),
)

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=3.0, help="--measure-seconds (split between the rounds)")
parser.add_argument("--threads", type=int, default=2)
args = parser.parse_args()


def exportgate(*command: str, cwd: Path, codes=(0,)) -> None:
    result = subprocess.run([*EXPORTGATE, *command], cwd=cwd, capture_output=True, text=True)
    if result.returncode not in codes:
        raise SystemExit(f"exportgate {' '.join(command)}: exit {result.returncode}\n{result.stderr[-3000:]}")


print("| model | GELU written as | way run | batch | latency ms (median, 95% interval) | vs built in | items/s "
      "| peak memory MB |")
print("|---|---|---|---|---|---|---|---|")
with tempfile.TemporaryDirectory() as tmp:
    folder = Path(tmp)
    for title, spec, name, route in ARTIFACTS:
        exportgate("export", spec, *route, "--out", name, "--no-verify", cwd=folder)
        exportgate("measure", name, "--gelu-forms", "--measure-seconds", str(args.seconds), "--threads",
                   str(args.threads), "--report", f"{name}.json", cwd=folder)
        measured = json.loads((folder / f"{name}.json").read_text())["measurement"]
        shipped = measured["timings"][0]
        for form, each in (("built in (as exported)", measured),
                           *((f["form"], f) for f in measured["gelu_forms"])):
            t = next(t for t in each["timings"] if (t["variant"], t["batch"]) == (shipped["variant"], shipped["batch"]))
            print(f"| {title} | {form} | {t['variant']} | {t['batch']} | {t['median_ms']:.1f} [{t['low_ms']:.1f}, "
                  f"{t['high_ms']:.1f}] | {t['median_ms'] / shipped['median_ms']:.3f}x | {t['items_per_second']:.2f} "
                  f"| {each['peak_rss_mb']:.0f} |", flush=True)
print(f"\n{args.threads} threads; {sys.platform}; the forms of each model measured in turn with it, 6 rounds each.")
