"""A .tflite file's static tensor shapes rewritten in place, for a runtime that sizes its buffers
from them.

LiteRT's CompiledModel sizes an output buffer from the output tensor's shape in the file, and a
model whose output shape is only known when it runs (a RESHAPE fed by SHAPE and GATHER, as Keras
writes a Dense over a 4-D input) overflows that buffer when it runs at another batch size
(resizing the inputs changes nothing there). Written with the shapes a run in the interpreter
produced, the file compiles at those sizes. Only the dims change; each shape keeps its rank and
its place in the flatbuffer.
"""

from __future__ import annotations

import struct

from verifiers.errors import BadInput
from verifiers.tflite_model import TFLiteModel, vector_extent


def with_static_shapes(model: TFLiteModel, shapes: dict[int, tuple[int, ...]], subgraph: int = 0) -> bytes:
    """The file's bytes with the static shape of each tensor index in `shapes` (of `subgraph`) set
    to the one given; BadInput where a rank differs, a dim fixed in the file changes, or the shape
    is stored where another tensor's is too (the file would say something else of that tensor)."""
    data = bytearray(model.data)
    reader = model.root.Subgraphs(subgraph)
    tensors = model.subgraphs[subgraph].tensors
    starts = {}
    for index in range(len(tensors)):
        found = vector_extent(reader.Tensors(index)._tab, 4, 4, len(data))
        if found is not None:
            starts.setdefault(found[0], []).append(index)
    for index, shape in shapes.items():
        tensor = tensors[index]
        if len(shape) != len(tensor.shape) or any(d >= 0 and d != s for d, s in zip(tensor.dims, shape)):
            raise BadInput(f"{model.path}: tensor {tensor.name!r} is {list(tensor.dims)} in the file, not {list(shape)}")
        if not shape:
            continue
        start = vector_extent(reader.Tensors(index)._tab, 4, 4, len(data))[0]
        if starts[start] != [index]:
            raise BadInput(f"{model.path}: tensor {tensor.name!r} shares its stored shape with another tensor")
        struct.pack_into(f"<{len(shape)}i", data, start, *shape)
    return bytes(data)
