"""The hand-written equivalent of `exportgate export MODEL --to tflite`: build the Keras model,
TFLiteConverter, both LiteRT interpreters (XNNPACK and the plain builtin kernels), the example and
three random batches through the model and both interpreters, the max abs difference.

    python bench/handwritten/keras_to_tflite.py bench/models.py:keras_bert_sized OUT.tflite
"""

import importlib.util
import os
import sys

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402
from ai_edge_litert.interpreter import Interpreter, OpResolverType  # noqa: E402

spec, out = sys.argv[1], sys.argv[2]
path, _, name = spec.rpartition(":")
module_spec = importlib.util.spec_from_file_location("bench_model", path)
module = importlib.util.module_from_spec(module_spec)
module_spec.loader.exec_module(module)
model, example = getattr(module, name)()
content = tf.lite.TFLiteConverter.from_keras_model(model).convert()
with open(out, "wb") as fh:
    fh.write(content)
interpreters = [Interpreter(model_path=out, experimental_op_resolver_type=r)
                for r in (OpResolverType.AUTO, OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)]
for interpreter in interpreters:
    interpreter.allocate_tensors()
rng = np.random.default_rng(0)
batches = [example] + [{k: (rng.standard_normal(v.shape) * 2).astype(v.dtype) for k, v in example.items()}
                       for _ in range(3)]
worst = 0.0
for batch in batches:
    expected = np.asarray(model(batch, training=False) if len(batch) > 1 else model(next(iter(batch.values()))))
    for interpreter in interpreters:
        for detail, value in zip(interpreter.get_input_details(), batch.values()):
            interpreter.set_tensor(detail["index"], value)
        interpreter.invoke()
        got = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
        worst = max(worst, float(np.abs(expected - got).max()))
print(f"max abs diff {worst:.3g}")
