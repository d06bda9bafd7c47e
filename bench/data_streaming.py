"""`exportgate verify --data` on BERT-sized inputs (a tiny BERT, eight sequences of 128 tokens a
batch; exported first by exportgate, not timed): beside the hand-written loop of
bench/handwritten/verify_on_data.py over the same 1,000 samples, then alone on 100, 1,000 and
10,000 samples, to show that memory does not grow with the samples and time grows linearly.

    python bench/data_streaming.py [--rounds 3]

Goals (issue 35): wall <= 1.2x the hand-written loop; peak RSS on 10,000 samples <= 1.1x on 100;
time linear in the samples: the wall on 1,000 samples within 10% of the line through 100 and
10,000 (the slope from 100 to 1,000 alone rests on a difference of a few seconds, within the
machine's noise).
"""

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from side_by_side import EXPORTGATE, REPO, compare, run_once

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()
model = str(REPO / "bench" / "models.py") + ":bert_tiny_seq128"
with tempfile.TemporaryDirectory() as tmp:
    artifact = f"{tmp}/bert.onnx"
    run_once([*EXPORTGATE, "export", model, "--to", "onnx", "--opset", "17", "--exporter", "torchscript",
              "--out", artifact], Path(tmp))
    rng = np.random.default_rng(0)
    for count in (100, 1000, 10000):
        np.savez(f"{tmp}/{count}.npz", input_ids=rng.integers(0, 1000, (count, 128)),
                 attention_mask=np.ones((count, 128), np.int64))

    def verify(count: int) -> list[str]:
        return [*EXPORTGATE, "verify", artifact, "--source", model, "--data", f"{tmp}/{count}.npz"]

    compare([(
        "exportgate verify --data (1,000)",
        verify(1000),
        "hand-written loop (1,000)",
        [sys.executable, str(REPO / "bench/handwritten/verify_on_data.py"), model, artifact, f"{tmp}/1000.npz"],
    )], args.rounds, Path(tmp), goals={"exportgate verify --data (1,000)": (1.2, 1.3)})

    runs = {count: [run_once(verify(count), Path(tmp)) for _ in range(args.rounds)] for count in (100, 1000, 10000)}
    wall = {count: min(w for w, _ in measured) for count, measured in runs.items()}
    rss = {count: max(r for _, r in measured) for count, measured in runs.items()}
    for count in runs:
        print(f"exportgate verify --data ({count:,} samples)   wall min {wall[count]:7.2f} s   RSS max {rss[count]:.2f} GB")
    rss_ratio = rss[10000] / rss[100]
    slope = (wall[10000] - wall[100]) / 9900
    on_line = wall[100] + 900 * slope
    off = wall[1000] / on_line - 1
    print(f"RSS 10,000 / 100 samples: {rss_ratio:.3f}x   goal <= 1.10x: {'met' if rss_ratio <= 1.1 else 'NOT met'}")
    print(f"per sample {1000 * slope:.2f} ms (100 to 10,000); 1,000 samples took {wall[1000]:.2f} s, the line says "
          f"{on_line:.2f} s: {100 * off:+.1f}%   goal within 10%: {'met' if abs(off) <= 0.1 else 'NOT met'}")
