"""`exportgate verify` of BERT-base in float16 (exported by `exportgate export --quantize fp16`, not
timed: its float16 arithmetic emulated beside onnxruntime's own run) beside `exportgate verify`
of the same model in float32, then the emulation's own cost: one batch through onnxruntime's
session of the float16 file and through the emulated graph, by hand.

    python bench/float16_verify.py [--rounds 3]

Goal (issue 36): float16 verify wall <= 2x float32 verify, peak RSS <= 1.5x.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from side_by_side import EXPORTGATE, REPO, compare, run_once

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()
model = str(REPO / "bench" / "models.py") + ":bert_base"
with tempfile.TemporaryDirectory() as tmp:
    for name, options in (("bert32.onnx", []), ("bert16.onnx", ["--quantize", "fp16"])):
        run_once([*EXPORTGATE, "export", model, "--to", "onnx", "--opset", "17", "--exporter", "torchscript",
                  *options, "--out", f"{tmp}/{name}"], Path(tmp))
    compare([(
        "exportgate verify (float16)",
        [*EXPORTGATE, "verify", f"{tmp}/bert16.onnx", "--source", model],
        "exportgate verify (float32)",
        [*EXPORTGATE, "verify", f"{tmp}/bert32.onnx", "--source", model],
    )], args.rounds, Path(tmp), goals={"exportgate verify (float16)": (2.0, 1.5)})

    import numpy as np
    import onnx
    import onnxruntime as ort

    sys.path.insert(0, str(REPO))
    from verifiers.onnx_float16 import emulated

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    start = time.perf_counter()
    emulation = ort.InferenceSession(emulated(onnx.load(f"{tmp}/bert16.onnx")).SerializeToString(), options,
                                     providers=["CPUExecutionProvider"])
    built = time.perf_counter() - start
    plain = ort.InferenceSession(f"{tmp}/bert16.onnx", providers=["CPUExecutionProvider"])
    feed = {"input_ids": np.random.default_rng(0).integers(0, 30522, (1, 128)),
            "attention_mask": np.ones((1, 128), np.int64)}
    for name, session in (("onnxruntime's own run", plain), ("float16 emulated", emulation)):
        session.run(None, feed)
        times = []
        for _ in range(10):
            start = time.perf_counter()
            session.run(None, feed)
            times.append(time.perf_counter() - start)
        print(f"{name:24} one batch: median {1000 * statistics.median(times):7.1f} ms")
    print(f"{'the emulation':24} rewritten and loaded in {built:.2f} s")
