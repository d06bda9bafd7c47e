"""PyTorch as a source framework: nn.Module from a builder, or a torch.export ExportedProgram (.pt2)."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from verifiers.errors import BadInput, one_line
from exporter.frameworks import Framework
from exporter.sources import InputSpec, Source
from verifiers.gelu.torch_sites import is_exported_program


class TorchFramework(Framework):
    name = "torch"
    extra = "torch"
    modules = ("torch",)
    suffixes = (".pt2",)
    load_runs_code = "torch.export.load unpickles parts of a .pt2 (weights_only=False), which can run code"

    def owns(self, obj: Any) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and (isinstance(obj, torch.nn.Module) or is_exported_program(obj))

    def load_file(self, path: Path, trusted: bool = False) -> Any:
        torch = self.require("torch")
        try:
            return torch.export.load(str(path))
        except Exception as exc:
            raise BadInput(f"{path}: not a readable torch.export program: {one_line(exc)}") from exc

    def make_source(self, spec, model, example, input_specs, default_inputs):
        torch = self.require("torch")
        if isinstance(model, torch.nn.Module):
            model.eval()
        by_keyword = isinstance(example, Mapping)
        arrays: dict[str, np.ndarray] | None = None
        if example is not None:
            values = list(example.values()) if by_keyword else list(example)
            names = list(example.keys()) if by_keyword else _positional_names(model, len(values))
            arrays = {name: _to_numpy(value, name) for name, value in zip(names, values)}
        elif not input_specs:
            if is_exported_program(model):
                input_specs = _exported_program_inputs(model)
            input_specs = input_specs or default_inputs()
            if not input_specs:
                raise BadInput(
                    f"{spec}: the PyTorch model comes without example inputs; return "
                    "(model, example_inputs) from the callable or pass --input NAME:SHAPE:DTYPE"
                )
        if arrays is not None:  # --input specs apply to them afterwards (exporter.sources.apply_input_specs)
            input_specs = [InputSpec(name, tuple(a.shape), a.dtype.name) for name, a in arrays.items()]
        return Source(spec, self, model, list(input_specs), arrays, by_keyword=by_keyword)

    def run(self, source, feed):
        torch = self.require("torch")
        tensors = [torch.from_numpy(np.ascontiguousarray(feed[name])) for name in source.input_names]
        module = source.model.module() if is_exported_program(source.model) else source.model
        with torch.no_grad():
            if source.by_keyword:
                result = module(**dict(zip(source.input_names, tensors)))
            else:
                result = module(*tensors)
        real = isinstance(result, Mapping)
        names, arrays = _flatten_outputs(result)
        if not arrays:
            raise BadInput(f"{source.spec}: the model returned no tensors")
        return names, real, arrays

    def activation_sites(self, source, feed):
        """Captured in inference mode, as the source runs (BatchNorm on batch 1, Dropout off)."""
        from verifiers.gelu.torch_sites import torch_activation_sites

        torch = self.require("torch")
        if isinstance(source.model, torch.nn.Module):
            source.model.eval()
        args, kwargs = self.example_tensors(source, feed)
        return torch_activation_sites(source.model, args, kwargs)

    def trace(self, source, feed):
        """The program torch.export captures, run node by node (exporter.tracing.torch_trace)."""
        from exporter.tracing.torch_trace import trace_torch

        torch = self.require("torch")
        if isinstance(source.model, torch.nn.Module):
            source.model.eval()
        args, kwargs = self.example_tensors(source, feed)
        return trace_torch(source.model, args, kwargs, source.input_names)

    def parameters(self, source):
        module = source.model.module() if is_exported_program(source.model) else source.model
        found: dict[str, list[np.ndarray]] = {}
        for name, parameter in module.named_parameters():
            owner = name.rpartition(".")[0]
            found.setdefault(owner, []).append(parameter.detach().float().numpy())
        return found

    def example_tensors(self, source, feed):
        """Positional args and keyword args for torch.onnx.export."""
        torch = self.require("torch")
        tensors = [torch.from_numpy(np.ascontiguousarray(feed[name])) for name in source.input_names]
        if source.by_keyword:
            return (), dict(zip(source.input_names, tensors))
        return tuple(tensors), None


def _positional_names(model: Any, count: int) -> list[str]:
    try:
        forward = model.forward
        params = [
            p.name for p in inspect.signature(forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError, AttributeError):
        params = []
    if len(params) >= count:
        return params[:count]
    return [f"input_{i}" for i in range(count)]


def _to_numpy(value: Any, name: str) -> np.ndarray:
    torch = sys.modules["torch"]
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:
            value = value.float()
        return value.numpy()
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (int, float, bool, list)):
        return np.asarray(value)
    raise BadInput(f"example input {name!r} is a {type(value).__name__}; expected a tensor or an array")


def _flatten_outputs(value: Any) -> tuple[list[str], list[np.ndarray]]:
    """Tensors of a model's output in the order torch.onnx flattens them (pytree), named by their
    path: dict keys ("logits", "past_key_values_0_1") or positions ("output_0")."""
    from torch.utils import _pytree as pytree

    torch = sys.modules["torch"]
    if isinstance(value, torch.Tensor):
        return ["output"], [_to_numpy(value, "output")]
    names, arrays = [], []
    for path, leaf in pytree.tree_flatten_with_path(value)[0]:
        if not isinstance(leaf, torch.Tensor):
            continue
        parts = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
        name = "_".join(parts) if parts and not parts[0].isdigit() else "_".join(["output", *parts])
        names.append(name)
        arrays.append(_to_numpy(leaf, name))
    return names, arrays


def _exported_program_inputs(program: Any) -> list:
    specs = []
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in program.graph_signature.user_inputs:
            continue
        val = node.meta.get("val")
        if val is None or not hasattr(val, "shape"):
            return []
        shape = tuple(int(d) if str(d).isdigit() else 2 for d in val.shape)
        specs.append(InputSpec(node.name, shape, str(val.dtype).removeprefix("torch.")))
    return specs
