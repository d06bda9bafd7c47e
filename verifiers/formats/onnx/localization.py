"""ONNX artifacts for localisation: the graph read without its weights, what each exporter records
of the source, and runs in onnxruntime through models that share the artifact's weights on disk.

What exporters record:
- torch.onnx's dynamo exporter names the value an FX node becomes after the node (`linear_3`) and
  writes on every ONNX node the FX node it was made from (`pkg.torch.onnx.fx_node`), the module
  paths above it (`pkg.torch.onnx.name_scopes`) and the Python stack (`pkg.torch.onnx.stack_trace`);
  the nodes made from one FX node form a group whose output read outside the group is the FX
  node's value, whatever it is named (onnxruntime's optimizer keeps such names on what it fuses).
- the TorchScript exporter names nodes by module scope: `/encoder/layer.0/attention/self/query/MatMul`.
- tf2onnx names nodes after the TensorFlow ops they come from and their outputs `op:0`, as the
  TensorFlow graph names its tensors.

Runs go through `Runner.run_inspection`: the graph is rebuilt without weights, its initializers
read from the artifact's files where they lie (verifiers.onnx_model.load_structure), with every
kept tensor a graph output and every replaced tensor read from a new graph input.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import onnx

from verifiers.localization.graph import ArtifactGraph, OpView, Scope, TensorView
from verifiers.onnx_model import load_structure

_FX_NODE = re.compile(r"^%(\S+)")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_TORCH_FILE = re.compile(r"[\\/](site|dist)-packages[\\/]torch[\\/]")
REPLACED = "{}::source"  # the graph input a replaced tensor's readers read instead
RUN_BYTES = 1 << 30  # kept tensors past this are fetched over several runs
_BIASED = frozenset({"Conv", "Gemm", "ConvTranspose"})  # their third input is a bias they add


class OnnxGraph(ArtifactGraph):
    format = "onnx"

    def __init__(self, path: Path):
        self.path = Path(path)
        self.model = load_structure(self.path).model
        graph = self.model.graph
        # the types the file declares (no shape inference: what it leaves out, the first run tells)
        infos = {v.name: v for v in (*graph.input, *graph.value_info, *graph.output)}
        for init in graph.initializer:  # typed by what they hold
            infos.setdefault(init.name, onnx.helper.make_tensor_value_info(init.name, init.data_type, init.dims))
        constants = {init.name for init in graph.initializer}
        constants |= {o for node in graph.node if node.op_type == "Constant" for o in node.output}
        # An Identity of a constant is that constant under another name (the TorchScript exporter
        # writes weights that hold the same values, e.g. freshly initialised biases, that way).
        self.aliases = {}
        for node in graph.node:
            if node.op_type == "Identity" and node.input[0] in constants:
                constants.add(node.output[0])
                self.aliases[node.output[0]] = self.aliases.get(node.input[0], node.input[0])
        self.tensors = {}
        for name in [*(v.name for v in graph.input), *(init.name for init in graph.initializer)]:
            self.tensors.setdefault(name, _tensor(name, infos.get(name), name in constants))
        self.ops = []
        for index, node in enumerate(graph.node):
            metadata = {prop.key: prop.value for prop in node.metadata_props}
            self.ops.append(OpView(index, node.name or f"{node.op_type}#{index}", node.op_type, tuple(node.input),
                                   tuple(node.output), _scope(node, metadata), _fx_keys(metadata), _location(metadata),
                                   bias=node.op_type in _BIASED and len(node.input) > 2 and bool(node.input[2])))
            for name in node.input:
                if name:
                    self.tensors.setdefault(name, _tensor(name, infos.get(name), name in constants))
                    self.tensors[name].readers.append(index)
            for name in node.output:
                if name:
                    tensor = self.tensors.setdefault(name, _tensor(name, infos.get(name), name in constants))
                    tensor.producer = index
        self.inputs = {v.name: v.name for v in graph.input if v.name not in constants}
        self.outputs = [v.name for v in graph.output]
        self.output_names = {name: name for name in self.outputs}
        self._name_group_outputs()

    def _name_group_outputs(self) -> None:
        """Each tensor's keys: its own name (dynamo and tf2onnx name values after what they come
        from) and, for the output of a group of nodes made from one FX node, that node's name."""
        groups: dict[str, set[int]] = {}
        for op in self.ops:
            for key in op.keys:
                groups.setdefault(key, set()).add(op.index)
        outputs = set(self.outputs)
        for tensor in self.tensors.values():  # tf2onnx's names are TensorFlow's: also without the model's scope
            tensor.keys = (tensor.name, tensor.name.split("/", 1)[1]) if "/" in tensor.name and not \
                tensor.name.startswith("/") else (tensor.name,)
        for key, members in groups.items():
            leaving = [t for i in sorted(members) for t in self.ops[i].outputs
                       if t and (t in outputs or any(r not in members for r in self.tensors[t].readers))]
            if len(leaving) == 1 and key not in self.tensors[leaving[0]].keys:
                self.tensors[leaving[0]].keys += (key,)

    def constant(self, tensor_id):
        from onnx import numpy_helper

        tensor_id = self.aliases.get(tensor_id, tensor_id)
        init = next((i for i in self.model.graph.initializer if i.name == tensor_id), None)
        if init is None:  # a Constant node's value
            made = next((n for n in self.model.graph.node if n.op_type == "Constant" and tensor_id in n.output), None)
            value = next((a.t for a in made.attribute if a.name == "value"), None) if made is not None else None
            return None if value is None else numpy_helper.to_array(value)
        if init.data_location == onnx.TensorProto.EXTERNAL:
            from onnx.external_data_helper import load_external_data_for_tensor

            init = onnx.TensorProto.FromString(init.SerializeToString())
            load_external_data_for_tensor(init, str(self.path.parent))
        return numpy_helper.to_array(init)

    def run(self, feed, keep, replace, runner_class):
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        graph = model.graph
        renamed = {name: REPLACED.format(name) for name in replace}
        for node in graph.node:
            node.input[:] = [renamed.get(name, name) for name in node.input]
        graph.input.extend(onnx.helper.make_tensor_value_info(
            renamed[name], onnx.helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
            for name, value in replace.items())
        full_feed = {**feed, **{renamed[name]: value for name, value in replace.items()}}
        values: dict[str, np.ndarray] = {}
        for chunk in self._chunks(keep):
            del graph.output[:]
            graph.output.extend(onnx.ValueInfoProto(name=name) for name in chunk)
            values.update(runner_class.run_inspection(model.SerializeToString(), full_feed, chunk, self.path.parent))
        return values

    def _chunks(self, keep: list[str]) -> list[list[str]]:
        """`keep` cut into runs that each return at most RUN_BYTES (sizes from the shapes the graph
        declares; a tensor of unknown size counts as a graph input's)."""
        default = max((_bytes(self.tensors[name]) or 0 for name in self.inputs), default=0) or 1 << 20
        chunks, size = [[]], 0
        for name in keep:
            bytes_ = _bytes(self.tensors[name]) or default
            if chunks[-1] and size + bytes_ > RUN_BYTES:
                chunks.append([])
                size = 0
            chunks[-1].append(name)
            size += bytes_
        return [chunk for chunk in chunks if chunk]


def _bytes(tensor: TensorView) -> int | None:
    if tensor.shape is None or tensor.dtype is None or any(d <= 0 for d in tensor.shape):
        return None
    return int(np.prod(tensor.shape)) * np.dtype(tensor.dtype).itemsize


def _tensor(name: str, info: onnx.ValueInfoProto | None, constant: bool) -> TensorView:
    shape = dtype = None
    if info is not None and info.type.HasField("tensor_type"):
        tensor_type = info.type.tensor_type
        if tensor_type.elem_type:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name
        if tensor_type.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim)
    return TensorView(name, name, shape, dtype, constant)


def _fx_keys(metadata: dict[str, str]) -> tuple[str, ...]:
    match = _FX_NODE.match(metadata.get("pkg.torch.onnx.fx_node", ""))
    return (match.group(1),) if match else ()


def _location(metadata: dict[str, str]) -> str | None:
    frames = [(file, line) for file, line in _FRAME.findall(metadata.get("pkg.torch.onnx.stack_trace", ""))
              if not _TORCH_FILE.search(file)]
    return f"{Path(frames[-1][0]).name}:{frames[-1][1]}" if frames else None


def _scope(node: onnx.NodeProto, metadata: dict[str, str]) -> Scope | None:
    if "pkg.torch.onnx.name_scopes" in metadata:  # dynamo: the module paths from the root, then the op
        try:
            scopes = ast.literal_eval(metadata["pkg.torch.onnx.name_scopes"])
        except (ValueError, SyntaxError):
            scopes = []
        module = scopes[-2] if len(scopes) >= 2 else ""
        return Scope(tuple(module.split(".")) if module else (), "module")
    if node.name.startswith("/"):  # TorchScript
        return Scope(tuple(node.name.split("/")[1:-1]), "torchscript")
    if "/" in node.name:  # tf2onnx: the TensorFlow op's name scope
        return Scope(tuple(node.name.split("/")[:-1]), "tf")
    return None
