"""TFLite artifacts: ai-edge-litert's Interpreter, twice.

One interpreter uses the default op resolver, which applies the XNNPACK delegate; the other uses
BUILTIN_WITHOUT_DEFAULT_DELEGATES, the plain builtin kernels. They differ: XNNPACK's exact GELU
returns 0 below x = -6 and has >1e-3 relative error for x in [-5.07, -3.68]. `run` returns the
default (XNNPACK) outputs, `run_all` both.

A file holding float16 values (`--quantize fp16`: float16 weights the interpreter dequantizes to
float32) runs a third way, `float16`: LiteRT's CompiledModel on the CPU with XNNPACK forced to
FP16 inference (TFLITE_XNNPACK_DELEGATE_FLAG_FORCE_FP16), every op XNNPACK takes computed in
float16 as an FP16 device computes it (on x86, FP32 arithmetic rounded to FP16 after each op:
XNNPACK's emulation mode), so a value past 65504 overflows there as on a GPU. `arithmetic` says
what each variant computes in, and why a float16 run could not be made.

Inputs and outputs go through the signature runner by name when the model has a SignatureDef,
by tensor order otherwise. The file is checked before the interpreter sees it (identifier, offsets,
every index in range), so a truncated or garbage file is one InvalidArtifact line.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from verifiers.errors import ExportgateError, one_line
from verifiers.quiet import native_output_captured
from verifiers import runtimes
from verifiers.runtimes import InvalidArtifact, Runner, TensorInfo

DEFAULT_SIGNATURE = "serving_default"
# XNNPACK delegate flags (tensorflow/lite/delegates/xnnpack/xnnpack_delegate.h): QS8 and QU8, its
# defaults, and FORCE_FP16.
_XNNPACK_FORCE_FP16 = 0x1 | 0x2 | 0x4
FLOAT32_KERNELS = ("float32: LiteRT's CPU kernels and XNNPACK dequantize float16 weights to float32 and compute "
                   "there, so intermediate values never overflow")
FLOAT16_FORCED = ("float16: XNNPACK forced to FP16 inference, every op it takes rounded to float16, overflowing "
                  "to Inf")


class LiteRtRunner(Runner):
    runtime = "ai-edge-litert"
    formats = ("tflite",)
    imports = ("ai_edge_litert.interpreter", "verifiers.tflite_model")
    variants = ("xnnpack", "builtin")  # the default resolver (XNNPACK delegate), the plain builtin kernels

    def __init__(self, model: Path | bytes, data_folder: Path | None = None):
        in_memory = isinstance(model, (bytes, bytearray))
        self.path = Path("<in-memory model>") if in_memory else Path(model)
        self._source = {"model_content": bytes(model)} if in_memory else {"model_path": str(self.path)}
        validate(model)
        with native_output_captured():  # LiteRT announces its XNNPACK delegate on stderr
            self._load()
            if self._holds_float16():
                self._force_float16(model)

    def _holds_float16(self) -> bool:
        return any(np.dtype(d["dtype"]) == np.float16 for d in self.interpreters["builtin"].get_tensor_details())

    def _force_float16(self, model: Path | bytes) -> None:
        """The `float16` variant (see the module's docstring), or `arithmetic` saying why not."""
        self.arithmetic = {variant: FLOAT32_KERNELS for variant in self.variants}
        try:
            self.forced = _ForcedFloat16(model, self.signature, self.inputs, self.outputs)
        except Exception as exc:  # noqa: BLE001 - a CPU XNNPACK cannot run FP16 on: said, and the run is not green
            self.arithmetic["float16"] = f"not run: LiteRT cannot force XNNPACK to FP16 here: {one_line(exc)}"
            return
        self.arithmetic["float16"] = FLOAT16_FORCED + (
            "" if self.forced.whole else "; the ops XNNPACK does not take compute in float32")
        self.variants = (*self.variants, "float16")

    @classmethod
    def probe(cls, model: bytes, variant: str | None = None) -> LiteRtRunner:
        """One interpreter for a probe model without signatures: the plain builtin kernels unless
        `variant` is "xnnpack", one thread."""
        runner = cls.__new__(cls)
        runner.path, runner.variants = Path("<probe>"), (variant or "builtin",)
        runner.signature, runner._runners = None, {}
        with native_output_captured():
            interpreter = _interpreter_class()(model_content=bytes(model), num_threads=1,
                                               experimental_op_resolver_type=_resolvers()[runner.variants[0]])
            interpreter.allocate_tensors()
        runner.interpreters = {runner.variants[0]: interpreter}
        runner.inputs = [_info(d["name"], d) for d in interpreter.get_input_details()]
        runner.outputs = [_info(d["name"], d) for d in interpreter.get_output_details()]
        return runner

    @classmethod
    def run_inspection(cls, model, feed, keep, data_folder=None):
        """The builtin kernels without a delegate, keeping every tensor
        (experimental_preserve_all_tensors); inputs are fed and tensors read by tensor index."""
        with native_output_captured():
            interpreter = _interpreter_class()(model_content=bytes(model), experimental_preserve_all_tensors=True,
                                               experimental_op_resolver_type=_resolvers()["builtin"])
            details = interpreter.get_input_details()
            for detail in details:
                value = feed[str(detail["index"])]
                if tuple(detail["shape"]) != value.shape:
                    interpreter.resize_tensor_input(detail["index"], value.shape)
            interpreter.allocate_tensors()
            for detail in details:
                interpreter.set_tensor(detail["index"], np.ascontiguousarray(feed[str(detail["index"])]))
            interpreter.invoke()
        return {key: np.array(interpreter.get_tensor(int(key)), copy=True) for key in keep}

    def _load(self) -> None:
        Interpreter, resolvers = _interpreter_class(), _resolvers()
        self.interpreters = {}
        for key, resolver in resolvers.items():
            try:
                interpreter = Interpreter(**self._source, experimental_op_resolver_type=resolver,
                                          num_threads=runtimes.run_threads or None)
            except Exception as exc:
                raise InvalidArtifact(f"{self.path}: ai-edge-litert cannot load it: {one_line(exc)}") from exc
            self.interpreters[key] = interpreter
        first = self.interpreters["xnnpack"]
        signatures = first.get_signature_list()
        if signatures:
            self.signature = DEFAULT_SIGNATURE if DEFAULT_SIGNATURE in signatures else min(signatures)
            try:
                self._runners = {k: i.get_signature_runner(self.signature) for k, i in self.interpreters.items()}
            except Exception as exc:
                raise InvalidArtifact(
                    f"{self.path}: ai-edge-litert cannot load signature {self.signature!r}: {one_line(exc)}"
                ) from exc
            runner = self._runners["xnnpack"]
            self.inputs = _signature_infos(runner.get_input_details())
            self.outputs = _signature_infos(runner.get_output_details())
        else:
            self.signature = None
            self._runners = {}
            for interpreter in self.interpreters.values():
                try:
                    interpreter.allocate_tensors()
                except Exception as exc:
                    raise InvalidArtifact(f"{self.path}: ai-edge-litert cannot allocate it: {one_line(exc)}") from exc
            self.inputs = [_info(d["name"], d) for d in first.get_input_details()]
            self.outputs = [_info(d["name"], d) for d in first.get_output_details()]

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The first variant's outputs (the XNNPACK delegate's, unless a probe asked for another),
        in `outputs` order."""
        return self._run_one(self.variants[0], feed)

    def run_all(self, feed: dict[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
        """Outputs of both interpreters: {"xnnpack": [...], "builtin": [...]}."""
        return self.run_each({key: feed for key in self.variants})

    def run_each(self, feeds: dict[str, dict[str, np.ndarray]]) -> dict[str, list[np.ndarray]]:
        with native_output_captured():
            runs = {key: self._run_one(key, feed) for key, feed in feeds.items() if key != "float16"}
            if "float16" in feeds:  # at the shapes the interpreter's run of the same feed makes
                feed = feeds["float16"]
                shaped = next((runs[key] for key in runs if feeds[key] is feed), None) or self._run_one("builtin", feed)
                runs["float16"] = self.forced.run(feed, [value.shape for value in shaped])
        return {key: runs[key] for key in feeds}

    def timed_call(self, variant: str, feed: dict[str, np.ndarray]):
        """The signature runner's own call (no output captured around it, no copy of its outputs),
        for a model with signatures; else the run as `run_each` makes it."""
        if self.signature is None or variant not in self._runners:
            return super().timed_call(variant, feed)
        runner, values = self._runners[variant], {info.name: np.ascontiguousarray(feed[info.name]) for info in self.inputs}
        return lambda: runner(**values)

    def _run_one(self, key: str, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        values = [np.ascontiguousarray(feed[info.name]) for info in self.inputs]
        if self.signature is not None:
            result = self._runners[key](**{info.name: v for info, v in zip(self.inputs, values)})
            return [np.array(result[info.name], copy=True) for info in self.outputs]
        interpreter = self.interpreters[key]
        details = interpreter.get_input_details()
        resized = False
        for detail, value in zip(details, values):
            if tuple(detail["shape"]) != value.shape:
                interpreter.resize_tensor_input(detail["index"], value.shape)  # as the signature runner does
                resized = True
        if resized:
            interpreter.allocate_tensors()
        for detail, value in zip(interpreter.get_input_details(), values):
            interpreter.set_tensor(detail["index"], value)
        interpreter.invoke()
        return [np.array(interpreter.get_tensor(d["index"]), copy=True) for d in interpreter.get_output_details()]


class _ForcedFloat16:
    """A TFLite model in LiteRT's CompiledModel on the CPU, XNNPACK forced to FP16, fed and read by
    the names of `inputs` and `outputs` (the signature's, or the tensors' where it has none). It is
    compiled at the shapes of each run (verifiers.tflite_static_shapes: the CompiledModel sizes its
    output buffers from the file), the outputs' shapes given by the interpreter's run of the feed."""

    def __init__(self, model: Path | bytes, signature: str | None, inputs: list[TensorInfo],
                 outputs: list[TensorInfo]):
        from verifiers.tflite_model import as_model

        self.file = as_model(bytes(model) if isinstance(model, (bytes, bytearray)) else model)
        graph = self.file.subgraphs[0]
        if signature is not None:
            entry = next(sd for sd in self.file.signatures if sd.key == signature)
            given, read = dict(entry.inputs), dict(entry.outputs)
        else:
            given = read = {graph.tensors[i].name: i for i in (*graph.inputs, *graph.outputs)}
        self.tensors = {info.name: given[info.name] for info in inputs}
        self.outputs = [(info.name, read[info.name], np.dtype(info.dtype)) for info in outputs]
        self.signature = signature
        self._compile(None)  # at the file's shapes: raises where LiteRT cannot force FP16 here
        self.at = {index: graph.tensors[index].shape for index in (*self.tensors.values(), *(i for _, i, _ in self.outputs))}
        self.whole = self.compiled.is_fully_accelerated()

    def _compile(self, shapes: dict[int, tuple[int, ...]] | None) -> None:
        from ai_edge_litert.compiled_model import CompiledModel
        from ai_edge_litert.hardware_accelerator import HardwareAccelerator
        from ai_edge_litert.options import CpuOptions, Options

        from verifiers.tflite_static_shapes import with_static_shapes

        options = Options(hardware_accelerators=HardwareAccelerator.CPU,
                          cpu_options=CpuOptions(num_threads=runtimes.run_threads, xnnpack_flags=_XNNPACK_FORCE_FP16))
        self.compiled = None  # the last compilation goes before the next is made
        self.compiled = CompiledModel.from_buffer(self.file.data if shapes is None else with_static_shapes(self.file, shapes),
                                                  options=options)
        self.key = self.signature or next(iter(self.compiled.get_signature_list()))
        self.at = shapes

    def run(self, feed: dict[str, np.ndarray], output_shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
        shapes = {index: tuple(feed[name].shape) for name, index in self.tensors.items()}
        shapes.update((index, tuple(shape)) for (_, index, _), shape in zip(self.outputs, output_shapes))
        if shapes != self.at:
            self._compile(shapes)
        given = self.compiled.get_input_tensor_details(self.key)
        read = self.compiled.get_output_tensor_details(self.key)
        # Written and read as bytes: the Python TensorBuffer takes no int64 or bool, which inputs such as
        # token ids are; the buffer itself has the tensor's type.
        inputs = {}
        for name in self.tensors:
            inputs[_named(given, name)] = buffer = self.compiled.create_input_buffer_by_name(self.key, _named(given, name))
            buffer.write(np.ascontiguousarray(feed[name]).view(np.int8))
        names = [_named(read, name) for name, _, _ in self.outputs]
        buffers = {name: self.compiled.create_output_buffer_by_name(self.key, name) for name in names}
        self.compiled.run_by_name(self.key, inputs, buffers)
        return [buffers[name].read(int(np.prod(shape)) * dtype.itemsize, np.int8).view(dtype).reshape(shape)
                for name, (_, _, dtype), shape in zip(names, self.outputs, output_shapes)]


def _named(details: dict, name: str) -> str:
    """The CompiledModel's name for a tensor the interpreter calls `name` (its signature's name, or
    the tensor's where the model has no signature)."""
    return name if name in details else next(key for key, detail in details.items() if detail["name"] == name)


def _interpreter_class():
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError as exc:
        from verifiers.errors import MissingFramework

        raise MissingFramework("ai_edge_litert", "tflite") from exc
    return Interpreter


def _resolvers() -> dict:
    """Variant -> op resolver: the default (XNNPACK delegate) and the plain builtin kernels."""
    from ai_edge_litert.interpreter import OpResolverType

    return {"xnnpack": OpResolverType.AUTO, "builtin": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}


def _signature_infos(details: dict) -> list[TensorInfo]:
    """Signature tensors in the order of the subgraph's tensors (the traced function's argument
    order; get_signature_list lists them sorted by name), or by number when they are all named
    output_0, output_1, ... (unnamed outputs, which a name sort would put output_10 before output_2)."""
    numbered = [re.fullmatch(r"output_(\d+)", name) for name in details]
    if details and all(numbered):
        order = sorted(details, key=lambda name: int(name.rsplit("_", 1)[1]))
    else:
        order = sorted(details, key=lambda name: details[name]["index"])
    return [_info(name, details[name]) for name in order]


def _info(name: str, detail: dict) -> TensorInfo:
    signature = detail.get("shape_signature")
    dims = signature if signature is not None and len(signature) else detail["shape"]
    shape = [None if int(d) < 0 else int(d) for d in dims]
    dtype = np.dtype(detail["dtype"])
    scale, zero_point = detail.get("quantization", (0.0, 0))
    quantization = (float(scale), int(zero_point)) if dtype.kind in "iu" and scale else None
    return TensorInfo(name, shape, dtype.name, quantization)


def validate(model: Path | bytes) -> None:
    """Refuse what is not a whole TFLite flatbuffer before the interpreter touches it
    (verifiers.tflite_model checks the identifier, every offset and every index)."""
    from verifiers.tflite_model import as_model

    try:
        as_model(model)
    except ExportgateError as exc:  # one line naming the file
        raise InvalidArtifact(str(exc)) from exc
