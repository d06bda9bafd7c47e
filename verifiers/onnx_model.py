"""Read ONNX files without running them: opsets, op counts, inputs and outputs, external data; and
the small readers of nodes and tensors the GELU sites, the probes and the writer share."""

from __future__ import annotations

import math
import os
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from verifiers.errors import BadInput, ExportgateError, one_line
from verifiers.onnx_wire import WireError, read_without_weights

DEFAULT_DOMAINS = ("", "ai.onnx")


# Initializers held inside the file with more bytes than this are not read by load_structure.
INLINE_WEIGHT_MIN_BYTES = 4096


@dataclass(frozen=True)
class Structure:
    """An ONNX file's graph without its weights. `model` names every tensor with its type and dims;
    weights in external data files stay there, and top-level initializers held inside the file
    (`inline`, by name) are marked as external data of the file itself, at their offsets in it."""

    model: onnx.ModelProto
    inline: frozenset[str] = frozenset()

    def external_data_files(self) -> list[str]:
        """The data files the model names (relative to its folder), the file itself not included."""
        return external_data_files(self.model, self.inline)


def load_structure(path: str | Path) -> Structure:
    """The graph without its weights, read without reading them (cheap for any size); the
    locations of its external data are checked (see check_external_data)."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such file")
    try:
        model, inline = read_without_weights(path, INLINE_WEIGHT_MIN_BYTES)
    except (WireError, DecodeError, ValueError, RuntimeError, OSError) as exc:
        raise BadInput(f"{path}: not a readable ONNX model: {one_line(exc)}") from exc
    if not model.graph.node and not model.opset_import:
        raise BadInput(f"{path}: not a readable ONNX model: empty graph")
    structure = Structure(model, inline)
    check_external_data(structure, path)
    return structure


def malformed_onnx_is_bad_input(path: Path, fn, *args):
    """fn(*args) on an ONNX file from anywhere: an error it raises on a model that onnx.checker
    also rejects (a mutated or hostile file: bytes where names go, unknown data types) is a
    one-line BadInput; on a model the checker accepts, it is a bug here and is raised as it is."""
    try:
        return fn(*args)
    except ExportgateError:
        raise
    except Exception as exc:
        load_structure(path)  # its external data checked before the checker reads the file
        try:
            onnx.checker.check_model(str(path))
        except Exception as rejected:
            raise BadInput(f"{path}: malformed ONNX model: {one_line(rejected)}") from exc
        raise


def check_external_data(structure: Structure, path: Path) -> None:
    """Refuse a model whose external data could reach outside its folder or is not plain data,
    before anything reads, hashes, loads or deletes it: every location must be a relative path
    without `..`, resolve (symlinks followed) inside the model's folder to a regular file, and
    hold each tensor's bytes at its offset and length."""
    folder = path.resolve().parent
    sizes: dict[str, int] = {}
    for tensor in external_tensors(structure.model, structure.inline):
        entries = {e.key: e.value for e in tensor.external_data}
        location = entries.get("location", "")
        where = f"{path}: external data of {tensor.name!r} at {location!r}"
        if not all(isinstance(value, str) for value in entries.values()):  # protobuf hands back bytes
            raise BadInput(f"{where}: its location, offset or length is not valid UTF-8 text")
        if location not in sizes:
            sizes[location] = _data_file_size(location, folder, where)
        try:
            offset, length = int(entries.get("offset", 0)), entries.get("length")
            length = int(length) if length is not None else None
        except ValueError as exc:
            raise BadInput(f"{where}: offset and length must be integers") from exc
        expected = _tensor_bytes(tensor)
        if offset < 0 or (length is not None and length < 0):
            raise BadInput(f"{where}: negative offset or length")
        if length is not None and expected is not None and length != expected:
            raise BadInput(f"{where}: length {length} but the tensor's shape and type take {expected} bytes")
        needed = offset + (length if length is not None else expected or 0)
        if needed > sizes[location]:
            raise BadInput(f"{where}: needs bytes up to {needed}, the file has {sizes[location]}")


def _data_file_size(location: str, folder: Path, where: str) -> int:
    parts = PurePosixPath(location.replace("\\", "/")).parts
    if not location or PurePosixPath(location).is_absolute() or PureWindowsPath(location).is_absolute() \
            or PureWindowsPath(location).drive or ".." in parts:
        raise BadInput(f"{where}: external data must be a relative path inside the model's folder")
    target = folder / location
    try:
        resolved = target.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise BadInput(f"{where}: missing ({one_line(exc)})") from exc
    if not resolved.is_relative_to(folder):
        raise BadInput(f"{where}: leads outside the model's folder (to {resolved})")
    info = os.stat(resolved)
    if not stat.S_ISREG(info.st_mode):
        raise BadInput(f"{where}: not a regular file")
    return info.st_size


_SUB_BYTE_BITS = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2, "FLOAT6E2M3": 6, "FLOAT6E3M2": 6}


def _tensor_bytes(tensor: onnx.TensorProto) -> int | None:
    """Bytes a tensor's dims and fixed-size type take (packed, for sub-byte types), or None for
    strings and types this onnx does not know."""
    type_name = onnx.TensorProto.DataType.Name(tensor.data_type) if tensor.data_type in \
        onnx.TensorProto.DataType.values() else None
    count = math.prod(tensor.dims)
    if type_name in _SUB_BYTE_BITS:
        return -(-count * _SUB_BYTE_BITS[type_name] // 8)
    if type_name is None or type_name == "STRING":
        return None
    try:
        return count * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None


def default_opset(model: onnx.ModelProto) -> int | None:
    for entry in model.opset_import:
        if entry.domain in DEFAULT_DOMAINS:
            return entry.version
    return None


def with_imported_domains(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model plus an import (version 1) of any node domain it forgot to import:
    onnxruntime.transformers' optimizer at opt_level=0 writes com.microsoft nodes without one."""
    imported = {o.domain for o in model.opset_import}
    missing = sorted({n.domain for n in model.graph.node} - imported - {"ai.onnx"})
    if not missing:
        return model
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    fixed.opset_import.extend(onnx.helper.make_opsetid(d, 1) for d in missing)
    return fixed


def elem_types(model: onnx.ModelProto, names: set[str]) -> dict[str, int]:
    """Element types of the named tensors: declared value infos and initializers, else shape inference."""

    def declared(graph: onnx.GraphProto) -> dict[str, int]:
        infos = [*graph.input, *graph.value_info, *graph.output]
        found = {vi.name: vi.type.tensor_type.elem_type for vi in infos if vi.name in names}
        found |= {t.name: t.data_type for t in graph.initializer if t.name in names}
        return {k: v for k, v in found.items() if v}

    found = declared(model.graph)
    if names - found.keys():
        try:
            inferred = onnx.shape_inference.infer_shapes(with_imported_domains(model))
        except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
            return found
        found = declared(inferred.graph) | found
    return found


def iter_nodes(graph: onnx.GraphProto):
    """Every node, subgraphs (If/Loop/Scan bodies) included, each body right after its node."""
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from iter_nodes(sub)


def subgraphs(node: onnx.NodeProto):
    """The graphs a node holds as attributes (If branches, Loop and Scan bodies)."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def iter_graphs(graph: onnx.GraphProto):
    """The graph and every subgraph inside it."""
    yield graph
    for node in graph.node:
        for sub in subgraphs(node):
            yield from iter_graphs(sub)


def external_tensors(model: onnx.ModelProto, inline: frozenset[str] = frozenset()):
    """Tensors (initializers, Constant values) whose data lives in an external file; the
    top-level initializers named in `inline` (held in the model's own file) left out."""
    from onnx.external_data_helper import _get_all_tensors

    top_level = len(model.graph.initializer)  # _get_all_tensors yields them first, in order
    for i, tensor in enumerate(_get_all_tensors(model)):
        if tensor.data_location == onnx.TensorProto.EXTERNAL and not (i < top_level and tensor.name in inline):
            yield tensor


def external_data_files(model: onnx.ModelProto, inline: frozenset[str] = frozenset()) -> list[str]:
    """Relative locations of the external data files a model refers to, in first-use order (the
    model's own file, for the `inline` initializers, not included)."""
    locations: dict[str, None] = {}
    for tensor in external_tensors(model, inline):
        for entry in tensor.external_data:
            if entry.key == "location":
                locations[entry.value] = None
    return list(locations)


def relocate_external_data(model_path: Path, old_to_new: dict[str, str]) -> None:
    """Point a model's external tensors at renamed data files (the data itself is not touched)."""
    model = onnx.load(str(model_path), load_external_data=False)
    for tensor in external_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value in old_to_new:
                entry.value = old_to_new[entry.value]
    onnx.save(model, str(model_path))


def _shape(value_info: onnx.ValueInfoProto) -> list[int | str]:
    tensor_type = value_info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return []
    return [d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in tensor_type.shape.dim]


def _dtype(value_info: onnx.ValueInfoProto) -> str:
    elem = value_info.type.tensor_type.elem_type
    return onnx.helper.tensor_dtype_to_np_dtype(elem).name if elem else "unknown"


def describe(path: str | Path, structure: Structure | None = None) -> dict[str, Any]:
    """What `exportgate inspect` shows for an ONNX file (`structure`: when already read)."""
    path = Path(path)
    structure = structure if structure is not None else load_structure(path)
    model = structure.model
    initializer_names = {t.name for t in model.graph.initializer}
    ops = Counter(
        f"{node.domain}.{node.op_type}" if node.domain not in DEFAULT_DOMAINS else node.op_type
        for node in iter_nodes(model.graph)
    )
    return {
        "path": str(path),
        "format": "onnx",
        "ir_version": model.ir_version,
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "opset": default_opset(model),
        "opset_imports": {(e.domain or "ai.onnx"): e.version for e in model.opset_import},
        "op_counts": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
        "inputs": [
            {"name": i.name, "shape": _shape(i), "dtype": _dtype(i)}
            for i in model.graph.input
            if i.name not in initializer_names
        ],
        "outputs": [{"name": o.name, "shape": _shape(o), "dtype": _dtype(o)} for o in model.graph.output],
        "external_data": structure.external_data_files(),
    }


# Ops that read a shape, or positions along axes, from an input: those inputs by position.
SHAPE_INPUTS = {"Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2), "ConstantOfShape": (0,)}


def constant_shapes(model: onnx.ModelProto) -> list[tuple[str, str, list[int]]]:
    """(node, op type, values) for every shape input of the main graph's Reshape, Expand, Tile,
    Slice and ConstantOfShape nodes that is a constant (an initializer held in the file, or a
    Constant node): sizes fixed when the artifact was made."""
    from onnx import numpy_helper


    constants = {t.name: t for t in model.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS:
            for attr in node.attribute:
                if attr.name == "value" and node.output:
                    constants[node.output[0]] = attr.t
                elif attr.name == "value_ints" and node.output:
                    constants[node.output[0]] = onnx.helper.make_tensor("", onnx.TensorProto.INT64, [len(attr.ints)],
                                                                        list(attr.ints))
    # A Slice of a Shape picks dimensions by position: its bounds are indices, not sizes.
    shapes = {node.output[0] for node in model.graph.node if node.op_type == "Shape" and node.output}
    found = []
    for node in model.graph.node:
        if node.op_type == "Slice" and node.input and node.input[0] in shapes:
            continue
        for k in SHAPE_INPUTS.get(node.op_type, ()) if node.domain in DEFAULT_DOMAINS else ():
            if k < len(node.input) and node.input[k] in constants:
                values = numpy_helper.to_array(constants[node.input[k]]).ravel()
                if values.dtype.kind in "iu":
                    found.append((node_label(node), node.op_type, [int(v) for v in values]))
    return found


_ONNX_DTYPE_NAMES = {
    onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64", onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16", onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT16: "uint16", onnx.TensorProto.INT16: "int16", onnx.TensorProto.UINT32: "uint32",
    onnx.TensorProto.INT32: "int32", onnx.TensorProto.UINT64: "uint64", onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.BOOL: "bool", onnx.TensorProto.STRING: "string", onnx.TensorProto.COMPLEX64: "complex64",
    onnx.TensorProto.COMPLEX128: "complex128",
}
for _name in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT8E8M0"):
    if hasattr(onnx.TensorProto, _name):
        _ONNX_DTYPE_NAMES[getattr(onnx.TensorProto, _name)] = "fp8"
for _name, _vocabulary_name in (("FLOAT4E2M1", "fp4"), ("INT4", "int4"), ("UINT4", "uint4"), ("INT2", "int2"),
                                ("UINT2", "uint2")):
    if hasattr(onnx.TensorProto, _name):
        _ONNX_DTYPE_NAMES[getattr(onnx.TensorProto, _name)] = _vocabulary_name


def onnx_dtype_name(elem_type: int) -> str:
    """TensorProto element type -> the matrix's dtype vocabulary (float32, fp8, int4...)."""
    if elem_type in _ONNX_DTYPE_NAMES:
        return _ONNX_DTYPE_NAMES[elem_type]
    try:
        return onnx.TensorProto.DataType.Name(elem_type).lower()
    except ValueError:  # a number no ONNX version names (a damaged file, or one newer than this onnx)
        return f"onnx type {elem_type}"


def node_label(node: onnx.NodeProto) -> str:
    """A node's name, or its first output when it has none (how sites name their nodes)."""
    return node.name or (node.output[0] if node.output else node.op_type)


def op_name(node: onnx.NodeProto) -> str:
    """The op type, as "{domain}.{op_type}" outside the default domain."""
    return node.op_type if node.domain in DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"


def node_attrs(node: onnx.NodeProto) -> dict:
    """A node's attributes by name (strings decoded; subgraph attributes left out)."""
    attrs = {}
    for a in node.attribute:
        if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            continue
        value = onnx.helper.get_attribute_value(a)
        attrs[a.name] = value.decode() if isinstance(value, bytes) else value
    return attrs


def tensor_value(tensor: onnx.TensorProto) -> np.ndarray | None:
    """A tensor's value, or None for one numpy cannot hold (a data type this onnx does not know,
    data that does not match its dims: hostile files pass onnx.checker with both)."""
    try:
        return numpy_helper.to_array(tensor)
    except (KeyError, ValueError, TypeError):
        return None


def constant_scalar(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a one-element Constant node, else None."""
    if len(node.attribute) != 1:
        return None
    attr = node.attribute[0]
    if attr.name == "value" and math.prod(attr.t.dims) == 1:
        return tensor_value(attr.t)
    if attr.name == "value_float":
        return np.asarray(attr.f, dtype=np.float32)
    if attr.name == "value_int":
        return np.asarray(attr.i, dtype=np.int64)
    return None


def subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name read by nodes of the graph's subgraphs (If/Loop/Scan bodies, nested)."""
    names: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                names.update(i for n in sub.node for i in n.input)
                names |= subgraph_reads(sub)
    return names
