"""OpenVINO: its CPU plugin runs an ONNX artifact as it deploys by default, at the inference
precision it picks on this CPU (bf16 where the CPU has bfloat16 instructions, f32 elsewhere: its
INFERENCE_PRECISION_HINT), or at the one --precision-hint pins. `precision` and `arithmetic` say
what it ran at, as the plugin reports it after compiling.

A file that computes in float16 also runs with float16 arithmetic emulated op by op: OpenVINO
converts float16 to float32 or bf16 and folds the emulation's float32-float16-float32 casts, so
that variant runs in onnxruntime (verifiers.runtimes.onnxruntime_runner), as onnxruntime's own
does. The file gets onnx.checker's check as there too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from verifiers import runtimes
from verifiers.errors import BadInput, one_line
from verifiers.runtimes import InvalidArtifact, ProbeFailed, Runner, TensorInfo

# --precision-hint's values (OpenVINO's spelling), and the type each computes in.
PRECISIONS = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


class OpenVinoRunner(Runner):
    runtime = "openvino"
    formats = ("onnx",)
    imports = ("openvino", "onnx", "verifiers.onnx_model")
    precision_hints = tuple(PRECISIONS)

    def __init__(self, model: Path | bytes, data_folder: Path | None = None):
        from verifiers.runtimes.onnxruntime_runner import checked_structure

        ov = _openvino()
        import onnx

        core = ov.Core()
        structure = None
        try:
            if isinstance(model, (bytes, bytearray)):
                self.path = Path("<in-memory model>")
                proto = onnx.load_from_string(bytes(model))
                graph, read = proto.graph, _read(core, bytes(model), proto, data_folder)
            else:
                self.path = Path(model)
                structure, self.notes = checked_structure(self.path, self.runtime)
                graph = structure.graph
                read = core.read_model(str(self.path))
            self._compile(core, read, graph, _config())
        except InvalidArtifact:
            raise
        except Exception as exc:
            raise InvalidArtifact(f"{self.path}: OpenVINO cannot load it: {one_line(exc)}") from exc
        ran_at = self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        self.precision = PRECISIONS.get(ran_at, ran_at)
        chosen = f"--precision-hint {runtimes.run_precision}" if runtimes.run_precision else "its default on this CPU"
        self.arithmetic = {"default": f"{self.precision}: OpenVINO's CPU plugin computes at {ran_at} ({chosen})"}
        self.sessions = {}
        if structure is not None:
            self._emulate_float16(structure)

    def _compile(self, core, read, graph, config: dict[str, object]) -> None:
        """Compile `read` for the CPU; its ports under the ONNX graph's own input and output names
        (OpenVINO gives a port every name its tensor had, a Cast's output's among them)."""
        self.compiled = core.compile_model(read, "CPU", config)
        self.request = self.compiled.create_infer_request()
        initializers = {t.name for t in graph.initializer}
        # Found by name in the model as read (compiling merges tensors and their names), at the same
        # position in the compiled model; an input no node reads is not in the model OpenVINO reads.
        read_inputs = {name: position for position, port in enumerate(read.inputs) for name in port.get_names()}
        inputs = [i.name for i in graph.input if i.name not in initializers and i.name in read_inputs]
        self.input_ports = [self.compiled.inputs[read_inputs[name]] for name in inputs]
        outputs = [o.name for o in graph.output]
        self.output_ports = [self.compiled.outputs[_position(read.outputs, name)] for name in outputs]
        self.inputs = [_info(name, port) for name, port in zip(inputs, self.input_ports)]
        self.outputs = [_info(name, port) for name, port in zip(outputs, self.output_ports)]

    def _emulate_float16(self, structure) -> None:
        from verifiers.onnx_float16 import computes_in_float16
        from verifiers.runtimes.onnxruntime_runner import float16_emulation

        if not computes_in_float16(structure):
            return
        session, self.arithmetic["float16"] = float16_emulation(structure, self.path.parent, runtimes.run_threads)
        if session is not None:
            self.arithmetic["float16"] += " (run in onnxruntime: OpenVINO folds the emulation's casts)"
            self.sessions["float16"] = session
            self.variants = ("default", "float16")

    @classmethod
    def probe(cls, model: bytes, variant: str | None = None) -> OpenVinoRunner:
        """The probe compiled at the precision the artifact runs at, on one thread."""
        import onnx

        runner = cls.__new__(cls)
        runner.path = Path("<probe>")
        core = _openvino().Core()
        proto = onnx.load_from_string(bytes(model))
        runner._compile(core, _read(core, bytes(model), proto), proto.graph, {**_config(), "INFERENCE_NUM_THREADS": 1})
        runner.sessions = {}
        return runner

    @classmethod
    def run_probe(cls, model: bytes, x: np.ndarray, variant: str | None = None) -> np.ndarray:
        try:
            return super().run_probe(model, x, variant)
        except RuntimeError as exc:  # OpenVINO's refusals (an op its frontend or plugin lacks)
            raise ProbeFailed(one_line(exc)) from exc

    @classmethod
    def run_inspection(cls, model, feed, keep, data_folder=None):
        """The inspection model compiled as the artifact runs (its precision, its threads); one that
        rounds values to float16 by casts (the float16 emulation's) runs in onnxruntime, since
        OpenVINO folds those casts."""
        import onnx

        from verifiers.runtimes.onnxruntime_runner import OnnxRuntimeRunner

        proto = onnx.load_from_string(bytes(model))
        if any(node.op_type == "Cast" and _cast_to(node) == onnx.TensorProto.FLOAT16 for node in proto.graph.node):
            return OnnxRuntimeRunner.run_inspection(model, feed, keep, data_folder)
        core = _openvino().Core()
        runner = cls.__new__(cls)
        runner._compile(core, _read(core, bytes(model), proto, data_folder), proto.graph, _config())
        values = runner.run({info.name: feed[info.name] for info in runner.inputs})
        return {name: value for name, value in zip((o.name for o in runner.outputs), values) if name in keep}

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        results = self.request.infer({port: feed[info.name] for info, port in zip(self.inputs, self.input_ports)})
        return [np.array(results[port]) for port in self.output_ports]

    def run_all(self, feed: dict[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
        return self.run_each({variant: feed for variant in self.variants})

    def run_each(self, feeds: dict[str, dict[str, np.ndarray]]) -> dict[str, list[np.ndarray]]:
        return {variant: self.run(feed) if variant == "default" else self.sessions[variant].run(None, feed)
                for variant, feed in feeds.items()}


def _openvino():
    try:
        import openvino
    except ImportError as exc:
        raise BadInput("--runtime openvino: OpenVINO is not installed here; pip install 'exportgate[openvino]'") from exc
    return openvino


def _config() -> dict[str, object]:
    """The CPU plugin's settings: --threads and --precision-hint where given, else its own."""
    config: dict[str, object] = {}
    if runtimes.run_threads:
        config["INFERENCE_NUM_THREADS"] = runtimes.run_threads
    if runtimes.run_precision:
        config["INFERENCE_PRECISION_HINT"] = runtimes.run_precision
    return config


def _read(core, model: bytes, proto, data_folder: Path | None = None):
    """OpenVINO's model of an in-memory ONNX model (`proto`: its bytes parsed), its external data
    read in from `data_folder`: OpenVINO reads a model from bytes without a folder to find them in."""
    from onnx.external_data_helper import load_external_data_for_model, uses_external_data

    if data_folder is None or not any(uses_external_data(t) for t in proto.graph.initializer):
        return core.read_model(model)
    with_weights = type(proto)()
    with_weights.CopyFrom(proto)
    load_external_data_for_model(with_weights, str(data_folder))
    return core.read_model(with_weights.SerializeToString())


def _cast_to(node) -> int | None:
    return next((attribute.i for attribute in node.attribute if attribute.name == "to"), None)


def _position(ports, name: str) -> int:
    """Where the port that carries the ONNX tensor `name` stands."""
    for position, port in enumerate(ports):
        if name in port.get_names():
            return position
    raise RuntimeError(f"OpenVINO has no port for tensor {name!r}")


def _info(name: str, port) -> TensorInfo:
    shape = [dim.get_length() if dim.is_static else None for dim in port.get_partial_shape()]
    return TensorInfo(name, shape, port.get_element_type().to_dtype().name)
