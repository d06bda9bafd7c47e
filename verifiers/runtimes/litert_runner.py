"""TFLite artifacts: ai-edge-litert's Interpreter, twice.

One interpreter uses the default op resolver, which applies the XNNPACK delegate; the other uses
BUILTIN_WITHOUT_DEFAULT_DELEGATES, the plain builtin kernels. They differ: XNNPACK's exact GELU
returns 0 below x = -6 and has >1e-3 relative error for x in [-5.07, -3.68]. `run` returns the
default (XNNPACK) outputs, `run_all` both.

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
            return {key: self._run_one(key, feed) for key, feed in feeds.items()}

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
