"""ONNX artifacts: onnx.checker (full check), then an onnxruntime CPU session with default options."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import numpy as np

from verifiers.errors import Incompatible, one_line
from verifiers.runtimes import InvalidArtifact, Runner, TensorInfo, register

_ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(bfloat16)": "bfloat16",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
}
# Load errors that mean "this runtime is too old for the artifact", not "the artifact is broken".
_RUNTIME_TOO_OLD = ("opset", "ir version", "ir_version", "not implemented", "unsupported")


@register
class OnnxRuntimeRunner(Runner):
    format = "onnx"
    runtime = "onnxruntime"

    def __init__(self, path: Path):
        import onnx
        import onnxruntime as ort

        from verifiers.onnx_model import load_structure

        self.path = Path(path)
        load_structure(self.path)  # refuses external data outside the model's folder before any read
        try:
            onnx.checker.check_model(str(self.path), full_check=True)
        except Exception as exc:
            raise InvalidArtifact(f"{self.path}: fails onnx.checker: {one_line(exc)}") from exc
        try:
            self.session = ort.InferenceSession(str(self.path), providers=["CPUExecutionProvider"])
        except Exception as exc:
            message = one_line(exc)
            if any(marker in message.lower() for marker in _RUNTIME_TOO_OLD):
                raise Incompatible(
                    f"onnxruntime {metadata.version('onnxruntime')} cannot load {self.path.name}: {message}"
                ) from exc
            raise InvalidArtifact(f"{self.path}: onnxruntime cannot load it: {message}") from exc
        self.inputs = [_info(i) for i in self.session.get_inputs()]
        self.outputs = [_info(o) for o in self.session.get_outputs()]

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, feed)


def _info(arg) -> TensorInfo:
    return TensorInfo(arg.name, list(arg.shape), _ORT_TYPES.get(arg.type, arg.type))
