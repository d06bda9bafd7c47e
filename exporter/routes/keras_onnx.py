"""Keras 3 -> ONNX with tf2onnx.

tf2onnx 1.17 quirks handled here:
- from_keras breaks on Sequential models, so the model is traced through from_function.
- TF writes exact GELU as 0.5*x*erfc(-x/sqrt 2); tf2onnx has no Erfc converter, logs it, writes an
  invalid model and reports success. A handler lowering Erfc to 1 - Erf is registered, and any op
  left unconverted fails the export.
- tf2onnx stops at opset 18 (and converts at 17 here, below): higher requests are converted up
  with onnx.version_converter and checked; a lower opset than asked is never handed back.
- from_function turns a captured tensor that is not a variable (keras-hub's position ids) into a
  second graph input, so the artifact cannot be fed like the source; and it leaves calls Keras
  jit-compiles (keras.applications ConvNeXt's grouped convolutions: StatefulPartitionedCall with
  _XlaMustCompile) unconverted. Such a function is frozen first (every capture a constant), its
  calls stripped of the jit marks so tf2onnx inlines them, and converted as a graph; inputs and
  outputs get back the names the freeze loses.
- Weights over protobuf's 2 GiB: frozen, they would make a GraphDef protobuf cannot hold, and
  tf2onnx's large_model path calls np.product (gone in numpy 2). The model is traced with its
  variables as inputs (Keras' stateless_call) and each becomes an initializer in one external
  data file beside the model.
- At opset 18 tf2onnx's transpose optimizer can misplace ReduceMean's axes input (ConvNeXt's last
  LayerNorm: a wrong artifact, which onnx.checker catches only when tf2onnx declared the output
  shape). Every conversion runs at 17 at most; 18 and above are raised with
  onnx.version_converter, and the note says so.

--quantize int8 exports float as above, then quantizes with onnxruntime (exporter.routes.onnx_quantize).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from verifiers.errors import Incompatible, one_line
from exporter.frameworks import FRAMEWORKS
from exporter.frameworks.keras_framework import prepare_keras_environment
from exporter.routes import ExportRequest, ExportResult, Route, check_int8_request
from exporter.routes.onnx_float16 import export_fp16
from exporter.routes.onnx_quantize import export_int8
from verifiers.quiet import quiet_exporter
from exporter.sources import Source

TF2ONNX_MAX_OPSET = 18
# The opset tf2onnx converts at, at most: at 18 its transpose optimizer misplaces ReduceMean's
# axes input (keras.applications ConvNeXt's last LayerNorm computes on the wrong axis; whether
# onnx.checker notices depends on the shapes it declares). Higher opsets are raised from here.
TF2ONNX_CONVERT_OPSET = 17
TF2ONNX_MIN_OPSET = 7
LARGE_MODEL_BYTES = 2**31 - 2**28  # weights past this leave the trace (protobuf stops at 2 GiB)
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


def weight_bytes(model) -> int:
    """Bytes of a Keras model's weights."""
    return sum(int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize for w in getattr(model, "weights", []))


WEIGHT_INPUT = "exportgate_weight_{}"


def weight_signature(tf, variables) -> list:
    """TensorSpecs for a model's variables passed as inputs after its own."""
    return [tf.TensorSpec(v.shape, v.dtype, name=WEIGHT_INPUT.format(i)) for i, v in enumerate(variables)]


def save_with_external_weights(proto, variables, dest: Path) -> str:
    """Save a model whose weights were traced as inputs (WEIGHT_INPUT) with each of them turned
    into an initializer in one external data file beside it (`<name>.data`, 4 KiB-aligned
    offsets, one variable in memory at a time); returns the data file's name."""
    import onnx
    from onnx import helper

    data_name = f"{dest.name}.data"
    by_name = {WEIGHT_INPUT.format(i): v for i, v in enumerate(variables)}
    kept = [value for value in proto.graph.input if value.name not in by_name]
    offset = 0
    with open(dest.parent / data_name, "wb") as data:
        for value in proto.graph.input:
            if value.name not in by_name:
                continue
            array = np.ascontiguousarray(by_name[value.name].numpy())
            offset = -(-offset // 4096) * 4096
            data.seek(offset)
            data.write(array.tobytes())
            tensor = onnx.TensorProto(name=value.name, dims=array.shape,
                                      data_type=helper.np_dtype_to_tensor_dtype(array.dtype),
                                      data_location=onnx.TensorProto.EXTERNAL)
            for key, item in (("location", data_name), ("offset", str(offset)), ("length", str(array.nbytes))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, item
            proto.graph.initializer.append(tensor)
            offset += array.nbytes
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    onnx.save(proto, str(dest))
    return data_name


def _rename(proto, renames: dict[str, str]) -> None:
    """Rename graph inputs and outputs (old name -> new) wherever the tensors are used."""
    renames = {old: new for old, new in renames.items() if old != new}
    for node in proto.graph.node:
        node.input[:] = [renames.get(t, t) for t in node.input]
        node.output[:] = [renames.get(t, t) for t in node.output]
    for value in [*proto.graph.input, *proto.graph.output]:
        value.name = renames.get(value.name, value.name)


class KerasToOnnx(Route):
    framework = "keras"
    format = "onnx"
    exporters = ("tf2onnx",)
    quantize_modes = ("int8", "fp16")
    opsets_written_by = (f"tf2onnx {TF2ONNX_MIN_OPSET} to {TF2ONNX_CONVERT_OPSET}, converted up to onnx's latest "
                         "by onnx.version_converter")

    def opsets(self) -> tuple[int, int]:
        import onnx.defs

        return TF2ONNX_MIN_OPSET, onnx.defs.onnx_opset_version()

    def export(self, source: Source, request: ExportRequest, dest: Path, progress) -> ExportResult:
        check_int8_request(request)
        if request.quantize == "int8":
            return export_int8(lambda path: self._export_float(source, request, path, progress), request, dest, progress)
        if request.quantize == "fp16":
            return export_fp16(lambda path: self._export_float(source, request, path, progress), request, dest,
                               progress)
        return self._export_float(source, request, dest, progress)

    def _export_float(self, source: Source, request: ExportRequest, dest: Path, progress) -> ExportResult:
        prepare_keras_environment()
        keras_fw = FRAMEWORKS["keras"]
        tf = keras_fw.require("tensorflow")
        keras_fw.require("tf2onnx")
        import onnx
        import tf2onnx

        register_erfc_lowering()
        label = f"tf2onnx {tf2onnx.__version__}"
        opset = request.opset  # within opsets(): exporter.routes.check_opset
        convert_opset = min(opset, TF2ONNX_CONVERT_OPSET) if opset is not None else None

        dynamic = {(a.input, a.axis) for a in request.dynamic}
        signature = keras_fw.tensor_signature(source, dynamic)
        variables = []
        if weight_bytes(source.model) > LARGE_MODEL_BYTES:
            # Frozen, the weights would be constants of a GraphDef past protobuf's 2 GiB, and
            # tf2onnx 1.17's large_model calls numpy's removed np.product. Traced as inputs
            # instead, they are written to external data straight from the variables.
            from exporter.frameworks.keras_framework import model_variables

            variables = model_variables(source.model)
            signature = [*signature, *weight_signature(tf, variables)]
        serve = keras_fw.serving_function(source, request.output_names, weights_as_inputs=bool(variables))

        progress(f"exporting with {label} at opset {convert_opset or 'default'}"
                 + (" (weights as inputs, then external data: over 2 GiB)" if variables else ""))
        proto, frozen_note = self._tf2onnx(tf, tf2onnx, serve, signature, convert_opset, label)
        notes = [frozen_note] if frozen_note else []
        if variables:
            notes.append(f"the weights exceed protobuf's 2 GiB: traced as inputs for {label}, then written "
                         "as initializers in external data")
        if opset is not None and opset > convert_opset:
            progress(f"converting opset {convert_opset} -> {opset} with onnx.version_converter")
            try:
                proto = onnx.version_converter.convert_version(proto, opset)
            except Exception as exc:
                raise Incompatible(
                    f"asked for opset {opset}: {label} wrote {convert_opset} and "
                    f"onnx.version_converter failed: {one_line(exc)}", kind="opset") from exc
            why = (" (its opset-18 transpose optimizer misplaces ReduceMean axes)" if opset <= TF2ONNX_MAX_OPSET
                   else f" (it stops at {TF2ONNX_MAX_OPSET})")
            notes.append(f"{label} wrote opset {convert_opset}{why}; onnx.version_converter raised it to {opset}")
        if variables:
            save_with_external_weights(proto, variables, Path(dest))
        else:
            onnx.save(proto, str(dest))
        return ExportResult(exporter=label, notes=notes)

    @staticmethod
    def _tf2onnx(tf, tf2onnx, serve, signature, opset, label):
        try:
            with quiet_exporter():
                proto, note = _convert(tf, tf2onnx, serve, signature, opset)
        except Exception as exc:
            raise Incompatible(f"{label} failed: {one_line(exc)}") from exc
        left = unconverted_ops(proto)
        if left:
            raise Incompatible(f"{label} could not convert {', '.join(left)} at opset {opset}")
        return proto, note
