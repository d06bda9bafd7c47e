"""Keras 3 -> ONNX with tf2onnx.

tf2onnx 1.17 quirks handled here:
- from_keras breaks on Sequential models, so the model is traced through from_function.
- TF writes exact GELU as 0.5*x*erfc(-x/sqrt 2); tf2onnx has no Erfc converter, logs it, writes an
  invalid model and reports success. A handler lowering Erfc to 1 - Erf is registered, and any op
  left unconverted fails the export.
- tf2onnx stops at opset 18: higher requests are converted up with onnx.version_converter and
  checked; a lower opset than asked is never handed back.
- from_function turns a captured tensor that is not a variable (keras-hub's position ids) into a
  second graph input, so the artifact cannot be fed like the source. Such a function is frozen
  first (every capture becomes a constant), and the outputs get back the names the freeze loses.
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


def _without_captured_tensors(tf, function, signature):
    """`function` itself, or, when it captures tensors that are not variables, a frozen copy with
    every capture a constant and the output names the copy loses (flattened order)."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    concrete = function.get_concrete_function(*signature)
    if all(t.dtype == tf.resource for t in concrete.captured_inputs):
        return function, []
    frozen = convert_variables_to_constants_v2(concrete)
    structured = concrete.structured_outputs
    names = tf.nest.flatten({k: k for k in structured}) if isinstance(structured, dict) else []
    return tf.function(lambda *args: frozen(*args)), names


def _rename_outputs(proto, names: list[str]) -> None:
    """Give the graph outputs `names`, in order, wherever the tensors are used."""
    renames = {out.name: name for out, name in zip(proto.graph.output, names) if out.name != name}
    for node in proto.graph.node:
        node.input[:] = [renames.get(t, t) for t in node.input]
        node.output[:] = [renames.get(t, t) for t in node.output]
    for out in proto.graph.output:
        out.name = renames.get(out.name, out.name)


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
                function, output_names = _without_captured_tensors(tf, tf.function(serve), signature)
                proto, _ = tf2onnx.convert.from_function(function, input_signature=signature, opset=convert_opset)
        except Exception as exc:
            raise Incompatible(f"tf2onnx failed: {one_line(exc)}") from exc
        if output_names:
            _rename_outputs(proto, output_names)
        left = unconverted_ops(proto)
        if left:
            raise Incompatible(f"tf2onnx could not convert {', '.join(left)} at opset {convert_opset}")
        notes = []
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
