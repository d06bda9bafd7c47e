"""The hand-written equivalent of `exportgate verify OUT.onnx --source MODEL --data DATA.npz`: the
model built from its spec, one onnxruntime session, the samples of DATA.npz (arrays by input name,
samples on axis 0) in batches of the model's example batch size through both sides, and each
sample's max abs difference, the worst printed.

    python bench/handwritten/verify_on_data.py bench/models.py:bert_tiny_seq128 OUT.onnx DATA.npz
"""

import importlib.util
import sys

import numpy as np
import onnxruntime as ort
import torch

spec, artifact, data = sys.argv[1:4]
path, _, name = spec.rpartition(":")
module_spec = importlib.util.spec_from_file_location("bench_model", path)
module = importlib.util.module_from_spec(module_spec)
module_spec.loader.exec_module(module)
model, example = getattr(module, name)()
batch = next(iter(example.values())).shape[0]
session = ort.InferenceSession(artifact, providers=["CPUExecutionProvider"])
feed_names = [i.name for i in session.get_inputs()]
samples = np.load(data)
count = len(samples[feed_names[0]])
worst, worst_sample = 0.0, 0
with torch.no_grad():
    for start in range(0, count, batch):
        feed = {k: samples[k][start:start + batch] for k in feed_names}
        expected = model(**{k: torch.from_numpy(v) for k, v in feed.items()})[0].numpy()
        got = session.run(None, feed)[0]
        errors = np.abs(expected - got).reshape(len(got), -1).max(axis=1)
        if errors.max() > worst:
            worst, worst_sample = float(errors.max()), start + int(errors.argmax())
print(f"{count} samples, max abs diff {worst:.3g} at sample {worst_sample}")
