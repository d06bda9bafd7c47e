"""Keras 3 -> TFLite with tf.lite.TFLiteConverter.

The model is traced through a tf.function whose TensorSpecs carry the source's input names and
which returns a dict keyed by the source's output names, so the artifact's SignatureDef
"serving_default" takes and returns the source's names (from_keras_model would name the outputs
output_0 ...).

TF 2.21 quirks handled here:
- from_concrete_functions with the Keras model as trackable object keeps the weights as resource
  variables that nothing initialises (VAR_HANDLE/READ_VARIABLE): XNNPACK then computes garbage and
  the builtin kernels fail. The Keras variables are handed over in a tf.Module so they are frozen
  into the model, and any resource-variable op left in the result fails the export.
- Without SELECT_TF_OPS an op with no TFLite builtin fails conversion; the ops are named. Exact
  GELU becomes the builtin GELU; an erf the converter does not fuse would need FlexErf, which
  neither interpreter here runs.
"""

from __future__ import annotations

import re
from pathlib import Path

from verifiers.errors import BadInput, Incompatible, one_line
from exporter.frameworks import FRAMEWORKS
from exporter.frameworks.keras_framework import prepare_keras_environment
from exporter.routes import ExportRequest, ExportResult, Route, check_int8_request, int8_result
from verifiers.quiet import quiet_exporter
from exporter.sources import Source

QUANTIZE_MODES = ("int8", "fp16", "dynamic-int8")
QUANTIZE_NOTES = {
    "int8": "--quantize int8: full-integer: int8 weights and activations, ranges calibrated on the calibration feeds",
    "fp16": "--quantize fp16: float16 weights, dequantised to float32 at load; compute stays float32",
    "dynamic-int8": "--quantize dynamic-int8: int8 weights, activations quantised on the fly (dynamic range)",
}


def check_tflite_request(request: ExportRequest) -> None:
    """Options the TFLite routes share: a --quantize mode they know (--opset is refused before
    anything loads: exporter.routes.check_opset)."""
    if request.quantize is not None and request.quantize not in QUANTIZE_MODES:
        raise BadInput(f"--quantize {request.quantize!r}: choose one of {', '.join(QUANTIZE_MODES)}")
    check_int8_request(request)


def calibrating(request: ExportRequest) -> str:
    """What a progress line adds for --quantize int8, whose conversion calibrates."""
    return f" (calibrating on {len(request.calibration)} batch(es))" if request.quantize == "int8" else ""


def _flex_ops(message: str) -> list[str]:
    """TF ops the converter could not lower to TFLite builtins, from its error message."""
    ops: set[str] = set()
    for line in re.findall(r"TF Select ops: ([^\n]+)", message):
        ops.update(op.strip() for op in line.split(",") if op.strip())
    ops.update(re.findall(r"'tf\.(\w+)' op is neither a custom op nor a flex op", message))
    return sorted(ops)


def _custom_ops(message: str) -> list[str]:
    ops: set[str] = set()
    for line in re.findall(r"Custom ops: ([^\n]+)", message):
        ops.update(op.strip() for op in line.split(",") if op.strip())
    return sorted(ops)


# Ops that read weights from resource variables: a converter that did not freeze a model's
# variables writes them, and the interpreter then reads uninitialised memory (XNNPACK) or fails.
RESOURCE_VARIABLE_OPS = ("VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE")


def check_converted(content: bytes, converter: str, allow_custom: bool = False):
    """Fail on an unreadable result, on Flex ops, on custom ops (unless allowed: the runner finds
    out whether they resolve) and on unfrozen (resource-variable) weights; return the parsed model."""
    from verifiers.tflite_model import parse_tflite

    try:
        model = parse_tflite(content, f"{converter} output")
    except BadInput as exc:
        raise Incompatible(str(exc)) from exc
    names = {code.name for code in model.opcodes}
    custom = sorted({code.name for code in model.opcodes if code.custom})
    flex = [name for name in custom if name.startswith("Flex")]
    if flex:
        raise Incompatible(f"{converter} wrote Flex ops {', '.join(flex)} (SELECT_TF_OPS), which "
                           "ai-edge-litert's builtin resolvers do not run")
    if custom and not allow_custom:
        raise Incompatible(f"{converter} wrote custom ops {', '.join(custom)}, which ai-edge-litert does not run")
    left = sorted(names & set(RESOURCE_VARIABLE_OPS))
    if left:
        raise Incompatible(f"{converter} left the weights as resource variables ({', '.join(left)}): "
                           "the model would read uninitialised memory")
    return model


def quantize_notes(quantize: str | None, content: bytes, converter: str, why: str = "") -> list[str]:
    """What --quantize did, including when the converter left every weight in float32."""
    if quantize is None:
        return []
    notes = [QUANTIZE_NOTES[quantize]]
    wanted = "float16" if quantize == "fp16" else "int8"
    from verifiers.tflite_model import parse_tflite, weight_dtypes

    if wanted not in weight_dtypes(parse_tflite(content)):
        notes.append(f"--quantize {quantize}: {converter} quantised no weight{why}; the artifact's "
                     "weights are all float32")
    return notes


class KerasToTflite(Route):
    framework = "keras"
    format = "tflite"
    exporters = ("tflite-converter",)
    quantize_modes = QUANTIZE_MODES

    def export(self, source: Source, request: ExportRequest, dest: Path, progress) -> ExportResult:
        check_tflite_request(request)
        prepare_keras_environment()
        tf = FRAMEWORKS["keras"].require("tensorflow")

        dynamic = {(a.input, a.axis) for a in request.dynamic}
        signature = FRAMEWORKS["keras"].tensor_signature(source, dynamic)
        serve = FRAMEWORKS["keras"].serving_function(source, request.output_names)
        model = source.model

        progress(f"converting with tf.lite.TFLiteConverter (TensorFlow {tf.__version__})"
                 + (f", --quantize {request.quantize}" if request.quantize else "") + calibrating(request))
        try:
            with quiet_exporter():
                function = tf.function(serve, input_signature=signature)
                concrete = function.get_concrete_function()
                holder = tf.Module()
                # Keras 3 variables wrap tf.Variables; tracked here, the converter freezes them.
                holder.weights = [getattr(v, "value", v) for v in model.variables]
                holder.serve = function
                converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], holder)
                converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
                if request.quantize is not None:
                    converter.optimizations = [tf.lite.Optimize.DEFAULT]
                if request.quantize == "fp16":
                    converter.target_spec.supported_types = [tf.float16]
                if request.quantize == "int8":
                    _full_integer(tf, converter, request, [spec.name for spec in signature])
                content = converter.convert()
        except Exception as exc:
            raise Incompatible(_conversion_failure(exc) + _with_dynamic(request)) from exc
        check_converted(content, "the TFLite converter")
        Path(dest).write_bytes(content)
        label = f"tf.lite.TFLiteConverter (TensorFlow {tf.__version__})"
        result = ExportResult(exporter=label, notes=quantize_notes(
            request.quantize, content, "the TFLite converter", " (it skips weight tensors under 1024 elements)"))
        if request.quantize == "int8":
            result.quantization = int8_result(request, f"{label} full-integer post-training quantization "
                                              "(representative dataset)", dest, "tflite")
        return result


def _full_integer(tf, converter, request: ExportRequest, argument_names: list[str]) -> None:
    """Full-integer post-training quantization: int8 kernels only (builtin float kernels too with
    allow_float), calibrated on the feeds in the function's argument order, float inputs and
    outputs as --io says (integer inputs such as token ids keep their types)."""
    io_type = {"float": tf.float32, "int8": tf.int8, "uint8": tf.uint8}[request.io]
    feeds = request.calibration

    def representative_dataset():
        for feed in feeds:
            yield [feed[name] for name in argument_names]

    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = representative_dataset
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8] + (
        [tf.lite.OpsSet.TFLITE_BUILTINS] if request.allow_float else [])
    converter.inference_input_type = converter.inference_output_type = io_type


def _conversion_failure(exc: Exception) -> str:
    """One line for a failed conversion: the Flex or custom ops it would need, else its first error."""
    message = str(exc)
    flex = _flex_ops(message)
    if flex or "ERROR_NEEDS_FLEX_OPS" in message:
        listed = ", ".join(f"{op} (Flex{op})" for op in flex) or "some ops"
        return (f"the TFLite converter has no builtin for {listed}: it would need SELECT_TF_OPS (Flex), which "
                "exportgate does not use and ai-edge-litert's builtin resolvers do not run")
    unquantizable = sorted(set(re.findall(r"Quantization not yet supported for op: '?([\w.]+)", message)))
    if unquantizable:
        return (f"the TFLite converter has no int8 kernel for {', '.join(unquantizable)}: --quantize int8 "
                "cannot quantize it (--allow-float-ops keeps such ops float)")
    custom = _custom_ops(message)
    if custom or "ERROR_NEEDS_CUSTOM_OPS" in message:
        return f"the TFLite converter needs custom ops {', '.join(custom) or '(unnamed)'}, which ai-edge-litert does not run"
    return f"the TFLite converter failed: {_first_error(message) or one_line(exc)}"


def _with_dynamic(request: ExportRequest) -> str:
    """What a failure with dynamic axes adds: which they are, and how to convert static shapes."""
    if not request.dynamic:
        return ""
    axes = ", ".join(f"{a.input} axis {a.axis}" for a in request.dynamic)
    return (f" (with {axes} dynamic: --dynamic, or None in the Keras model; fix their sizes with "
            "--input NAME:SHAPE:DTYPE to convert static shapes)")


def _first_error(message: str) -> str:
    """The first `error: ...` line of an MLIR diagnostic dump, without its location prefix."""
    for line in message.splitlines():
        if "error: " in line:
            return line.split("error: ", 1)[1].strip()
    return ""
