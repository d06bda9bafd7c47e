"""`exportgate inspect --json` and `exportgate check` of BERT-base as ONNX (about 435 MB, weights
inside the file), against absolute goals: <= 1.0 s wall and peak RSS <= 1.2x the
file size, importing neither torch nor TensorFlow.

    python bench/inspect_check.py [--rounds 3]

The file is built first by the hand-written export script (not timed).
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from side_by_side import EXPORTGATE, REPO, run_once

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()
with tempfile.TemporaryDirectory() as tmp:
    model = Path(tmp) / "bert.onnx"
    subprocess.run([sys.executable, str(REPO / "bench/handwritten/torch_to_onnx.py"),
                    str(REPO / "bench/models.py") + ":bert_base", str(model)], check=True, capture_output=True)
    size = model.stat().st_size / 1e9
    print(f"{model.name}: {size:.3f} GB")
    probe = ("import atexit, sys; seen = sys.argv.pop(); atexit.register(lambda: open(seen, 'w').write(str(sorted("
             "m for m in ('torch', 'tensorflow') if m in sys.modules))))\n")
    for command in (["inspect", str(model), "--json"], ["check", str(model), "--target", "ort-1.32"]):
        seen = Path(tmp) / "imported.txt"
        subprocess.run([sys.executable, "-c", probe + "from exporter.cli import console_main; console_main()", *command, str(seen)],
                       capture_output=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
        print(f"torch/tensorflow imported by {command[0]}: {seen.read_text()}")
    for label, command in (("inspect --json", [*EXPORTGATE, "inspect", str(model), "--json"]),
                           ("check --target ort-1.32", [*EXPORTGATE, "check", str(model), "--target", "ort-1.32"])):
        walls, rss = [], []
        for _ in range(args.rounds):
            wall, peak = run_once(command, Path(tmp))
            walls.append(wall)
            rss.append(peak)
        met = min(walls) <= 1.0 and max(rss) <= 1.2 * size
        print(f"{label:28} wall min {min(walls):.2f} s, median {statistics.median(walls):.2f} s; "
              f"peak RSS {max(rss):.2f} GB ({max(rss) / size:.2f}x the file): goal {'met' if met else 'NOT met'}")
