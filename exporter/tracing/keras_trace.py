"""A Keras model traced op by op on one batch (verifiers.localization.trace.SourceTrace).

The model is traced the way the Keras routes trace it (its serving function, through tf.function),
its variables frozen into constants, and the frozen graph run once in a TensorFlow session that
fetches every tensor. Each tensor is keyed by its TensorFlow name (`model/dense/MatMul:0`), which
tf2onnx and the TFLite converter keep; as Keras uniquifies the model's own name scope per trace
(`functional_1`, `functional_1_1`), the names without it are aliases. Its module is its Keras
layer path (`attention/query`: the name scopes below the model's, each without the `_N` a call
adds), its location the innermost frame of the op's creation outside TensorFlow and Keras' core
(a Keras layer's code, or the user's own layer).
"""

from __future__ import annotations

import re
from pathlib import PurePath

import numpy as np

from verifiers.localization.trace import SourceTensor, SourceTrace

_CALL_SUFFIX = re.compile(r"^(.*)_\d+$")
# Frames that are not model code: TensorFlow, Keras' backend and plumbing, exportgate itself.
_CORE = re.compile(r"[\\/](tensorflow|tf_keras)[\\/]|[\\/]keras[\\/]src[\\/](backend|ops|utils|models|trainers|"
                   r"layers[\\/]layer\.py)|[\\/]exporter[\\/]frameworks[\\/]")
_SKIPPED_OPS = {"Placeholder", "Const", "NoOp", "Identity", "ReadVariableOp"}


def trace_keras(source, feed: dict[str, np.ndarray], signature: list, serve) -> SourceTrace:
    """The op-by-op trace of a Keras source on `feed`: `serve` traced for `signature` (the
    framework's serving function and tensor signature, as the routes trace them)."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    concrete = tf.function(serve).get_concrete_function(*signature)
    created = {op.name: _location(op.traceback) for op in concrete.graph.get_operations()}
    frozen = convert_variables_to_constants_v2(concrete)
    graph_def = frozen.graph.as_graph_def()
    layers = _layer_names(source.model)
    trace = SourceTrace("keras", "/")
    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(graph_def, name="")
        placeholders = [graph.get_tensor_by_name(t.name) for t in frozen.inputs]
        fetched = [t for op in graph.get_operations() if op.type not in _SKIPPED_OPS for t in op.outputs
                   if t.dtype.is_floating or t.dtype.is_integer or t.dtype == tf.bool]
        with tf.compat.v1.Session(graph=graph) as session:
            values = session.run(fetched, {p: feed[name] for p, name in zip(placeholders, source.input_names)})
    for placeholder, name in zip(placeholders, source.input_names):
        trace.add(SourceTensor(placeholder.name, np.asarray(feed[name]), "input", ""))
        trace.inputs[name] = placeholder.name
    recorded = set(trace.tensors)
    for tensor, value in zip(fetched, values):
        value = np.asarray(value)
        if value.dtype.kind == "f" and value.dtype != np.float32:
            value = value.astype(np.float32)
        op = tensor.op
        inputs = tuple(_through_identities(t).name for t in op.inputs if _through_identities(t).name in recorded)
        trace.add(SourceTensor(tensor.name, value, op.type, _module(op.name, layers), created.get(op.name), inputs))
        recorded.add(tensor.name)
        trace.aliases[_rootless(tensor.name)] = tensor.name
    structured = concrete.structured_outputs
    by_name = structured if isinstance(structured, dict) else {}
    trace.outputs = [_through_identities(graph.get_tensor_by_name(by_name[name].name)).name
                     if name in by_name and by_name[name].name in {t.name for t in fetched} | recorded else None
                     for name in source.run(feed)[0]]
    return trace


def _through_identities(tensor):
    """The tensor an Identity chain passes on (frozen variables are read through Identity ops)."""
    while tensor.op.type == "Identity" and tensor.op.inputs:
        tensor = tensor.op.inputs[0]
    return tensor


def _rootless(name: str) -> str:
    """A TensorFlow name without its first name scope (the model's, which a trace may suffix)."""
    return name.split("/", 1)[1] if "/" in name else name


def _layer_names(model) -> set[str]:
    found = set()
    for layer in getattr(model, "_flatten_layers", lambda **_: [])(include_self=False, recursive=True):
        found.add(layer.name)
    return found


def _module(op_name: str, layers: set[str]) -> str:
    """The Keras layer path of an op: the name scopes below the model's that are layers' (each
    spelt as the layer is named, without the `_N` a call adds), not those of ops (`moments`)."""
    path = []
    for part in op_name.split("/")[1:-1]:
        match = _CALL_SUFFIX.match(part)
        if part in layers:
            path.append(part)
        elif match and match.group(1) in layers:
            path.append(match.group(1))
    return "/".join(path)


def _location(traceback) -> str | None:
    frames = [(frame.filename, frame.lineno) for frame in traceback or () if not _CORE.search(frame.filename)]
    return f"{PurePath(frames[-1][0]).name}:{frames[-1][1]}" if frames else None
