"""Read an ONNX file's graph without reading its weights, at the protobuf wire level.

An ONNX file is one ModelProto; a model exported with its weights inside (the TorchScript exporter,
tf2onnx) holds them as the raw_data of the graph's initializers, nearly all of the file. Parsing
the whole message copies every weight into memory (about 0.5 s and 1x the file for BERT-base).
Here the file is memory-mapped and its fields walked: every top-level initializer whose raw_data
is larger than a threshold is rewritten, without reading those bytes, as external data of the file
itself (location: the file's name, offset and length of the bytes in it), and only the rest, the
graph's structure and its small constants, goes to protobuf. What consumes the graph (opsets,
nodes, shape inference, GELU probes) sees every tensor's name, type and dims; what needs the weights
reads them from the file at the offsets given, as it reads any external data.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import onnx

# Wire types (protobuf encoding): varint, 64-bit, length-delimited, 32-bit.
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5
# Field numbers: ModelProto.graph, GraphProto.initializer, TensorProto.raw_data and the tensor's
# fields that say where its data lives (a tensor carrying them is left as it is).
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9
_TENSOR_LOCATION_FIELDS = (13, 14)  # external_data, data_location


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def read_without_weights(path: Path, min_bytes: int) -> tuple[onnx.ModelProto, frozenset[str]]:
    """The model in `path`, each top-level initializer with more than `min_bytes` of raw_data
    marked as external data of `path` itself instead of read; returns it and the names so marked.
    Raises WireError for bytes that are not a protobuf message, DecodeError for one that is not a
    ModelProto."""
    with open(path, "rb") as fh:
        if fh.seek(0, 2) == 0:
            raise WireError("empty file")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            kept, inline = _without_weights(mapped, min_bytes)
    model = onnx.ModelProto()
    model.ParseFromString(kept)
    if inline:
        _mark_inline(model, inline, Path(path).name)
    return model, frozenset(inline)


def _mark_inline(model: onnx.ModelProto, inline: dict[str, tuple[int, int]], file_name: str) -> None:
    """Mark the initializers left unread as external data of the file itself. A name given to
    two initializers would make the mark ambiguous: such a model is refused."""
    seen: set[str] = set()
    for tensor in model.graph.initializer:
        span = inline.get(tensor.name)
        if span is None:
            continue
        if tensor.name in seen:
            raise WireError(f"two initializers are named {tensor.name!r}")
        seen.add(tensor.name)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", file_name), ("offset", str(span[0])), ("length", str(span[1]))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value


def _without_weights(buf: mmap.mmap, min_bytes: int) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """The ModelProto's bytes with the large raw_data of top-level initializers left out, and
    name -> (offset, length) of what was left out (slicing the map copies only what is kept)."""
    parts: list = []
    inline: dict[str, tuple[int, int]] = {}
    for number, wire, start, begin, end in _fields(buf, 0, len(buf)):
        if number != _MODEL_GRAPH or wire != _BYTES:
            parts.append(buf[start:end])
            continue
        graph: list = []
        for g_number, g_wire, g_start, g_begin, g_end in _fields(buf, begin, end):
            tensor = None
            if g_number == _GRAPH_INITIALIZER and g_wire == _BYTES:
                tensor = _tensor_without_data(buf, g_begin, g_end, min_bytes)
            if tensor is None:
                graph.append(buf[g_start:g_end])
                continue
            header, span = tensor
            name = onnx.TensorProto.FromString(header).name
            if not name or name in inline:
                graph.append(buf[g_start:g_end])  # left for the checker to refuse, read as it is
                continue
            inline[name] = span
            graph.append(_length_delimited(_GRAPH_INITIALIZER, header))
        parts.append(_length_delimited(_MODEL_GRAPH, b"".join(graph)))
    return b"".join(parts), inline


def _tensor_without_data(buf: mmap.mmap, begin: int, end: int, min_bytes: int) -> tuple[bytes, tuple[int, int]] | None:
    """A TensorProto's bytes without its raw_data, and (offset, length) of that raw_data, when the
    raw_data is larger than `min_bytes`; None for a tensor to read as it is."""
    kept, raw = [], []
    for number, wire, start, data_begin, data_end in _fields(buf, begin, end):
        if number in _TENSOR_LOCATION_FIELDS:
            return None
        if number == _TENSOR_RAW_DATA and wire == _BYTES:
            raw.append((data_begin, data_end - data_begin))
        else:
            kept.append(buf[start:data_end])
    if len(raw) != 1 or raw[0][1] <= min_bytes:
        return None
    return b"".join(kept), raw[0]



def _fields(buf: mmap.mmap, begin: int, end: int):
    """(field number, wire type, start of the field, start of its value, end) of each field of the
    message in buf[begin:end]; a length-delimited value's start is past its length prefix."""
    pos = begin
    while pos < end:
        start = pos
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError(f"field number 0 at byte {start}")
        if wire == _VARINT:
            _, value_end = _varint(buf, pos, end)
            yield number, wire, start, pos, value_end
            pos = value_end
            continue
        if wire == _BYTES:
            length, pos = _varint(buf, pos, end)
            value_end = pos + length
        elif wire == _FIXED64:
            value_end = pos + 8
        elif wire == _FIXED32:
            value_end = pos + 4
        else:
            raise WireError(f"wire type {wire} (groups are not ONNX) at byte {start}")
        if value_end > end:
            raise WireError(f"field {number} at byte {start} runs past its message")
        yield number, wire, start, pos, value_end
        pos = value_end


def _varint(buf: mmap.mmap, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while shift < 64:
        if pos >= end:
            raise WireError(f"truncated varint at byte {pos}")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise WireError(f"varint longer than 10 bytes at byte {pos}")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | _BYTES) + _encode_varint(len(payload)) + payload
