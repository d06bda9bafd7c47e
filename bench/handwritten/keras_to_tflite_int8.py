"""The hand-written equivalent of `exportgate export MODEL --to tflite --quantize int8
--calibration FOLDER`: build the Keras model, TFLiteConverter full-integer post-training
quantization on the calibration feeds (one .npz per batch, arrays by input name), both LiteRT
interpreters (XNNPACK and the plain builtin kernels), three random batches through the model and
both interpreters, and each output's SQNR.

    python bench/handwritten/keras_to_tflite_int8.py bench/models.py:keras_mobilenet_v2 CALIBRATION_DIR OUT.tflite
"""

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402
from ai_edge_litert.interpreter import Interpreter, OpResolverType  # noqa: E402

spec, calibration, out = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
path, _, name = spec.rpartition(":")
module_spec = importlib.util.spec_from_file_location("bench_model", path)
module = importlib.util.module_from_spec(module_spec)
module_spec.loader.exec_module(module)
model = getattr(module, name)()
input_name = model.inputs[0].name
feeds = [np.load(file)[input_name] for file in sorted(calibration.glob("*.npz"))]

converter = tf.lite.TFLiteConverter.from_keras_model(model)
converter.optimizations = [tf.lite.Optimize.DEFAULT]
converter.representative_dataset = lambda: ([feed] for feed in feeds)
converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
content = converter.convert()
with open(out, "wb") as fh:
    fh.write(content)

interpreters = [Interpreter(model_path=out, experimental_op_resolver_type=r)
                for r in (OpResolverType.AUTO, OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)]
rng = np.random.default_rng(0)
shape = feeds[0].shape
worst = np.inf
for _ in range(3):
    batch = (rng.standard_normal(shape)).astype(np.float32)
    expected = np.asarray(model(batch, training=False), dtype=np.float64)
    for interpreter in interpreters:
        interpreter.resize_tensor_input(interpreter.get_input_details()[0]["index"], shape)
        interpreter.allocate_tensors()
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], batch)
        interpreter.invoke()
        got = interpreter.get_tensor(interpreter.get_output_details()[0]["index"]).astype(np.float64)
        noise = np.linalg.norm(expected - got)
        worst = min(worst, 20 * np.log10(np.linalg.norm(expected) / noise) if noise else np.inf)
print(f"worst SQNR {worst:.1f} dB")
