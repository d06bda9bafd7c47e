"""The hand-written equivalent of `exportgate export MODEL --to onnx --opset 17`: build the
model, torch.onnx.export (TorchScript), onnx.checker's full check, one onnxruntime session, the
example and three random batches through both sides, the max abs difference. With --verify-only,
of `exportgate verify OUT.onnx --source MODEL`: the same without the export. With --dynamic, every
axis of every input is exported dynamic (axis 0 "batch", axis 1 "seq", shared over the inputs)
and verified at the export size only.

    python bench/handwritten/torch_to_onnx.py bench/models.py:bert_base OUT.onnx [--verify-only] [--dynamic]
"""

import importlib.util
import sys

import numpy as np
import onnx
import onnxruntime as ort
import torch

spec, out = sys.argv[1], sys.argv[2]
path, _, name = spec.rpartition(":")
module_spec = importlib.util.spec_from_file_location("bench_model", path)
module = importlib.util.module_from_spec(module_spec)
module_spec.loader.exec_module(module)
model, example = getattr(module, name)()
by_keyword = isinstance(example, dict)
if not by_keyword:  # positional example inputs
    example = {f"input_{i}": t for i, t in enumerate(example)}
names = list(example)


class ByName(torch.nn.Module):
    """Positional inputs to the model's keyword arguments (how transformers models are traced)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.train(inner.training)  # torch.onnx.export puts the wrapper's mode back onto the model

    def forward(self, *args):
        out = self.inner(**dict(zip(names, args))) if by_keyword else self.inner(*args)
        return out[0] if isinstance(out, tuple) or hasattr(out, "last_hidden_state") else out


if "--verify-only" not in sys.argv[3:]:
    dynamic_axes = ({name: {k: ("batch", "seq")[k] for k in range(min(value.dim(), 2))} for name, value in example.items()}
                    if "--dynamic" in sys.argv[3:] else None)
    torch.onnx.export(ByName(model), tuple(example.values()), out, opset_version=17, dynamo=False,
                      input_names=names, output_names=["out"], dynamic_axes=dynamic_axes)
onnx.checker.check_model(out, full_check=True)
session = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
feed_names = [i.name for i in session.get_inputs()]  # by order: an artifact from another tool names them its way
rng = np.random.default_rng(0)
batches = [{k: v.numpy() for k, v in example.items()}]
for _ in range(3):
    batches.append({k: rng.integers(int(v.min()), int(v.max()) + 1, size=v.shape).astype(v.numpy().dtype)
                    if v.dtype in (torch.int64, torch.int32) else rng.standard_normal(v.shape).astype(np.float32)
                    for k, v in example.items()})
worst = 0.0
with torch.no_grad():
    for batch in batches:
        expected = ByName(model)(*[torch.from_numpy(v) for v in batch.values()]).numpy()
        got = session.run(None, dict(zip(feed_names, batch.values())))[0]
        worst = max(worst, float(np.abs(expected - got).max()))
print(f"max abs diff {worst:.3g}")
