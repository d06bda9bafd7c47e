"""Which artifact format a file holds, by suffix, then by its first bytes."""

from __future__ import annotations

from pathlib import Path

from verifiers.errors import BadInput

SUFFIXES = {".onnx": "onnx", ".tflite": "tflite"}


def detect_format(path: str | Path) -> str:
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such file")
    if path.suffix in SUFFIXES:
        return SUFFIXES[path.suffix]
    with open(path, "rb") as fh:
        head = fh.read(8)
    if head[4:8] == b"TFL3":
        return "tflite"
    if head[:1] == b"\x08":  # protobuf field 1 (ir_version), varint: how every ONNX file starts
        return "onnx"
    raise BadInput(f"{path}: neither an ONNX nor a TFLite file (use a .onnx or .tflite suffix)")
