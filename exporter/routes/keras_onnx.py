"""Keras 3 -> ONNX with tf2onnx.

tf2onnx 1.17 quirks handled here:
- from_keras breaks on Sequential models, so the model is traced through from_function.
- TF writes exact GELU as 0.5*x*erfc(-x/sqrt 2); tf2onnx has no Erfc converter, logs it, writes an
  invalid model and reports success. A handler lowering Erfc to 1 - Erf is registered, and any op
  left unconverted fails the export.
- tf2onnx stops at opset 18: higher requests are converted up with onnx.version_converter and
  checked; a lower opset than asked is never handed back.
- from_function turns a captured tensor that is not a variable (keras-hub's position ids) into a
  second graph input, so the artifact cannot be fed like the source; and it leaves calls Keras
  jit-compiles (keras.applications ConvNeXt's grouped convolutions: StatefulPartitionedCall with
  _XlaMustCompile) unconverted. Such a function is frozen first (every capture a constant), its
  calls stripped of the jit marks so tf2onnx inlines them, and converted as a graph; inputs and
  outputs get back the names the freeze loses.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from exporter.errors import Incompatible, one_line
from exporter.frameworks import FRAMEWORKS
from exporter.frameworks.keras_framework import prepare_keras_environment
from exporter.routes import ExportRequest, ExportResult, Route, register
from exporter.routes.quiet import quiet_exporter
from exporter.sources import Source

TF2ONNX_MAX_OPSET = 18
TF2ONNX_MIN_OPSET = 7
_erfc_lowering_registered = False


def register_erfc_lowering() -> None:
    """Teach tf2onnx to convert TF's Erfc as Sub(1, Erf(x)), so exact GELU survives exactly."""
    global _erfc_lowering_registered
    if _erfc_lowering_registered:
        return
    from tf2onnx import utils
    from tf2onnx.handler import tf_op

    @tf_op("Erfc")
    class Erfc:
        @classmethod
        def version_9(cls, ctx, node, **kwargs):
            np_dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
            erf = ctx.make_node("Erf", [node.input[0]], op_name_scope=node.name)
            one = ctx.make_const(utils.make_name(f"{node.name}_one"), np.array(1, dtype=np_dtype))
            node.type = "Sub"
            ctx.replace_inputs(node, [one.output[0], erf.output[0]])

    _erfc_lowering_registered = True


def unconverted_ops(model) -> list[str]:
    """Ops tf2onnx left as TF ops (it logs them and carries on)."""
    import onnx

    custom_domains = {e.domain for e in model.opset_import} - {"", "ai.onnx"}
    left = set()
    for node in model.graph.node:
        domain = node.domain or ""
        if domain in custom_domains:
            continue
        if not onnx.defs.has(node.op_type, domain):
            left.add(node.op_type)
    return sorted(left)


_JIT_MARKS = ("_XlaMustCompile", "_noinline")


def _needs_freezing(tf, concrete) -> bool:
    """Whether tf2onnx's from_function would mishandle the function: captured tensors that are
    not variables, or jit-compiled calls."""
    if any(t.dtype != tf.resource for t in concrete.captured_inputs):
        return True
    return any(item.attr[mark].b for item in _attributed(concrete.graph.as_graph_def())
               for mark in _JIT_MARKS if mark in item.attr)


def _attributed(graph_def) -> list:
    """The nodes, functions and function body nodes of a GraphDef: whatever carries jit marks."""
    functions = list(graph_def.library.function)
    return [*graph_def.node, *functions, *(n for f in functions for n in f.node_def)]


def _convert(tf, tf2onnx, serve, signature, opset):
    """tf2onnx's ONNX proto of `serve` traced for `signature`, and a note when it was frozen."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    function = tf.function(serve)
    concrete = function.get_concrete_function(*signature)
    if not _needs_freezing(tf, concrete):
        return tf2onnx.convert.from_function(function, input_signature=signature, opset=opset)[0], None
    frozen = convert_variables_to_constants_v2(concrete)
    graph_def = frozen.graph.as_graph_def()
    for item in _attributed(graph_def):
        for mark in _JIT_MARKS:
            if mark in item.attr:
                del item.attr[mark]
    inputs, outputs = [t.name for t in frozen.inputs], [t.name for t in frozen.outputs]
    proto, _ = tf2onnx.convert.from_graph_def(graph_def, input_names=inputs, output_names=outputs, opset=opset)
    structured = concrete.structured_outputs
    names = tf.nest.flatten({k: k for k in structured}) if isinstance(structured, dict) else []
    _rename(proto, dict(zip(outputs, names)) | {t: t.split(":")[0] for t in inputs})
    return proto, ("the function was frozen and its jit-compiled calls inlined before tf2onnx "
                   "(it captures constants or holds calls tf2onnx leaves unconverted)")


def _rename(proto, renames: dict[str, str]) -> None:
    """Rename graph inputs and outputs (old name -> new) wherever the tensors are used."""
    renames = {old: new for old, new in renames.items() if old != new}
    for node in proto.graph.node:
        node.input[:] = [renames.get(t, t) for t in node.input]
        node.output[:] = [renames.get(t, t) for t in node.output]
    for value in [*proto.graph.input, *proto.graph.output]:
        value.name = renames.get(value.name, value.name)


@register
class KerasToOnnx(Route):
    framework = "keras"
    format = "onnx"
    exporters = ("tf2onnx",)

    def export(self, source: Source, request: ExportRequest, dest: Path, progress) -> ExportResult:
        prepare_keras_environment()
        keras_fw = FRAMEWORKS["keras"]
        tf = keras_fw.require("tensorflow")
        keras_fw.require("tf2onnx")
        import onnx
        import tf2onnx

        register_erfc_lowering()
        opset = request.opset
        if opset is not None and opset < TF2ONNX_MIN_OPSET:
            raise Incompatible(f"asked for opset {opset}: tf2onnx starts at opset {TF2ONNX_MIN_OPSET}", kind="opset")
        convert_opset = min(opset, TF2ONNX_MAX_OPSET) if opset is not None else None

        dynamic = {(a.input, a.axis) for a in request.dynamic}
        signature = keras_fw.tensor_signature(source, dynamic)
        serve = keras_fw.serving_function(source, request.output_names)

        progress(f"exporting with tf2onnx {tf2onnx.__version__} at opset {convert_opset or 'default'}")
        try:
            with quiet_exporter():
                proto, frozen_note = _convert(tf, tf2onnx, serve, signature, convert_opset)
        except Exception as exc:
            raise Incompatible(f"tf2onnx failed: {one_line(exc)}") from exc
        left = unconverted_ops(proto)
        if left:
            raise Incompatible(f"tf2onnx could not convert {', '.join(left)} at opset {convert_opset}")
        notes = [frozen_note] if frozen_note else []
        if opset is not None and opset > TF2ONNX_MAX_OPSET:
            progress(f"converting opset {TF2ONNX_MAX_OPSET} -> {opset} with onnx.version_converter")
            try:
                proto = onnx.version_converter.convert_version(proto, opset)
            except Exception as exc:
                raise Incompatible(
                    f"asked for opset {opset}: tf2onnx stops at {TF2ONNX_MAX_OPSET} and "
                    f"onnx.version_converter failed: {one_line(exc)}", kind="opset") from exc
            notes.append(f"tf2onnx wrote opset {TF2ONNX_MAX_OPSET}; onnx.version_converter raised it to {opset}")
        onnx.save(proto, str(dest))
        return ExportResult(exporter=f"tf2onnx {tf2onnx.__version__}", notes=notes)
