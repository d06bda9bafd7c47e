"""A PyTorch model traced op by op on one batch (verifiers.localization.trace.SourceTrace).

The model is captured with torch.export (non-strict, as torch.onnx's dynamo exporter does) and
decomposed the way torch.onnx decomposes it before translating, so every FX node keeps the name the
dynamo exporter gives the ONNX value it becomes; the program is then run node by node
(torch.fx.Interpreter) and every node's output recorded with its module path (nn_module_stack) and
the innermost source line outside torch (stack_trace).

Each op is also recomputed in float64 on the same float32 inputs: the difference is the float32
rounding of that op alone, which the localisation's tolerance is made from. Ops that exporters
split into steps get the steps' values too (FINE_STEPS).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

import numpy as np

from verifiers.localization.trace import SourceTensor, SourceTrace

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_TORCH_FILE = re.compile(r"[\\/](site|dist)-packages[\\/]torch[\\/]")


def trace_torch(model: Any, args: tuple, kwargs: dict | None, input_names: list[str]) -> SourceTrace:
    """The op-by-op trace of `model` (an nn.Module or an ExportedProgram) on one batch."""
    import torch

    from verifiers.gelu.torch_sites import is_exported_program

    with torch.no_grad():
        program = model if is_exported_program(model) else torch.export.export(
            model, args, kwargs or {}, strict=False)
        trace = SourceTrace("torch", ".")
        program = _decomposed_as_onnx_does(program, trace)
        flat = program._graph_module_flat_inputs(args, kwargs or {})
        _Recorder(program.graph_module, trace, program, input_names).run(*flat)
    trace.outputs = [name if name in trace else None for name in program.graph_signature.user_outputs]
    return trace


def _decomposed_as_onnx_does(program, trace: SourceTrace):
    """The program as torch.onnx's dynamo exporter decomposes it (its nodes then bear the names
    the exporter gives ONNX values); unchanged when this torch has no such step."""
    try:
        from torch.onnx._internal.exporter import _core, _registration

        return _core._prepare_exported_program_for_export(program, registry=_registration.ONNXRegistry.from_torchlib())
    except Exception as exc:  # noqa: BLE001 - a torch without that private step: names differ, numbers still align
        trace.notes.append(f"the program is traced as torch.export made it (torch.onnx's decomposition failed: "
                           f"{type(exc).__name__})")
        return program


def _location(stack_trace: str | None) -> str | None:
    """`file.py:LINE` of the innermost frame outside torch."""
    frames = [(file, line) for file, line in _FRAME.findall(stack_trace or "") if not _TORCH_FILE.search(file)]
    return f"{PurePath(frames[-1][0]).name}:{frames[-1][1]}" if frames else None


def _module(node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return path if isinstance(path, str) else ""


def _target_name(target) -> str:
    name = getattr(target, "__name__", None) or str(target)
    overload = getattr(target, "_overloadpacket", None)
    if overload is not None:
        return f"aten.{getattr(overload, '__name__', name)}"
    return name


def _as_array(value) -> np.ndarray:
    """The tensor's values as an array sharing its memory (an exported program computes every
    node into a tensor of its own; a float of another width is widened to float32)."""
    import torch

    value = value.detach()
    if value.is_floating_point() and value.dtype != torch.float32:
        value = value.float()
    return value.contiguous().numpy()


class _Recorder:
    """Runs a (lifted) program graph module node by node, recording every tensor a call produces."""

    def __init__(self, graph_module, trace: SourceTrace, program, input_names: list[str]):
        import torch.fx

        self.trace = trace
        self.interpreter = torch.fx.Interpreter(graph_module)
        self.interpreter.run_node = self._run_node
        self.original = torch.fx.Interpreter.run_node.__get__(self.interpreter)
        user_inputs = list(program.graph_signature.user_inputs)
        self.user_inputs = dict(zip(user_inputs, input_names))
        self.values: dict[str, Any] = {}  # node name -> its torch value (for the float64 recomputation)

    def run(self, *args):
        return self.interpreter.run(*args)

    def _run_node(self, node):
        import torch

        result = self.original(node)
        if node.op == "placeholder" and node.name in self.user_inputs and isinstance(result, torch.Tensor):
            self.trace.add(SourceTensor(node.name, _as_array(result), "input", ""))
            self.trace.inputs[self.user_inputs[node.name]] = node.name
            self.values[node.name] = result
        elif node.op == "placeholder":
            self.values[node.name] = result
        elif node.op == "call_function" and isinstance(result, torch.Tensor):
            self._record(node, result)
        return result

    def _record(self, node, result) -> None:
        trace = self.trace
        inputs = tuple(n.name for n in node.all_input_nodes if n.name in trace)
        tensor = SourceTensor(node.name, _as_array(result), _target_name(node.target), _module(node),
                              _location(node.meta.get("stack_trace")), inputs)
        self.values[node.name] = result
        if result.is_floating_point():
            tensor.rounding = _rounding(node, result, self.values)
        trace.add(tensor)
        steps = FINE_STEPS.get(tensor.op)
        if steps is not None and result.is_floating_point():
            args, kwargs = _arguments(node, self.values)
            try:
                fine = steps(*args, **kwargs)
            except Exception:  # noqa: BLE001 - an unusual call of the op: no steps, the op is still traced
                fine = []
            for name, value in fine:
                trace.add(SourceTensor(f"{node.name}.{name}", _as_array(value), f"{tensor.op}.{name}", tensor.module,
                                       tensor.location, inputs, parent=node.name))


def _arguments(node, values: dict[str, Any]) -> tuple[list, dict]:
    import torch.fx

    def value(arg):
        if isinstance(arg, torch.fx.Node):
            return values.get(arg.name)
        if isinstance(arg, (list, tuple)):
            return type(arg)(value(a) for a in arg)
        return arg

    return [value(a) for a in node.args], {k: value(v) for k, v in node.kwargs.items()}


def _rounding(node, result, values: dict[str, Any]) -> float | None:
    """max |float32 result - the op recomputed in float64 on the same (float32) inputs|."""
    import torch

    args, kwargs = _arguments(node, values)

    def wide(arg):
        if isinstance(arg, torch.Tensor) and arg.is_floating_point():
            return arg.double()
        if isinstance(arg, (list, tuple)):
            return type(arg)(wide(a) for a in arg)
        if isinstance(arg, torch.dtype) and arg.is_floating_point:
            return torch.float64
        return arg

    try:
        exact = node.target(*[wide(a) for a in args], **{k: wide(v) for k, v in kwargs.items()})
    except Exception:  # noqa: BLE001 - no float64 kernel for this op
        return None
    if not isinstance(exact, torch.Tensor) or exact.shape != result.shape or not exact.is_floating_point():
        return None
    difference = (result.double() - exact.double()).abs()
    finite = torch.isfinite(difference)
    return float(difference[finite].max()) if bool(finite.any()) else 0.0


# ---- the steps of ops that exporters split ---------------------------------------------------------


def _linear(x, weight, bias=None):
    import torch

    return [("matmul", torch.matmul(x, weight.t()))] if bias is not None else []


def _addmm(bias, x, weight, beta=1, alpha=1):
    import torch

    return [("mm", torch.mm(x, weight))]


def _convolution(x, weight, bias=None, *rest):
    import torch

    if bias is None:
        return []
    return [("conv", torch.ops.aten.convolution.default(x, weight, None, *rest))]


def _layer_norm(x, shape, weight=None, bias=None, eps=1e-5, *rest):
    import torch

    dims = tuple(range(-len(shape), 0))
    mean = x.mean(dims, keepdim=True)
    centered = x - mean
    variance = (centered * centered).mean(dims, keepdim=True)
    rstd = torch.rsqrt(variance + eps)
    steps = [("mean", mean), ("centered", centered), ("squared", centered * centered), ("variance", variance),
             ("variance_eps", variance + eps), ("std", torch.sqrt(variance + eps)), ("rstd", rstd),
             # x * rstd - mean * rstd, as the TFLite converter writes it
             ("x_rstd", x * rstd), ("mean_rstd", mean * rstd), ("neg_mean_rstd", -(mean * rstd))]
    normalized = centered * rstd
    steps.append(("normalized", normalized))
    if weight is not None:
        steps.append(("scaled", normalized * weight))
    return steps


def _softmax(x, dim, *rest):
    import torch

    shifted = x - x.amax(dim, keepdim=True)
    exp = torch.exp(shifted)
    return [("shifted", shifted), ("exp", exp), ("sum", exp.sum(dim, keepdim=True))]


def _attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """The steps of eager attention: the scaled queries and keys, the scores, the mask added, the
    weights; in the forms exporters write them (scale on q and k by its square root, or once)."""
    import torch

    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeat, -3), value.repeat_interleave(repeat, -3)
    root = math.sqrt(scale)
    key_t = key.transpose(-2, -1)
    scores = torch.matmul(query, key_t) * scale
    steps = [("query_scaled", query * root), ("key_scaled", key * root), ("key_scaled_t", key_t * root),
             ("query_scale", query * scale), ("key_t", key_t), ("scores_raw", torch.matmul(query, key_t)),
             ("scores", scores)]
    bias = None
    if is_causal:
        size = (query.shape[-2], key.shape[-2])
        bias = torch.zeros(size, dtype=query.dtype).masked_fill(
            ~torch.ones(size, dtype=torch.bool).tril(), float("-inf"))
    if attn_mask is not None:
        bias = (torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(~attn_mask, float("-inf"))
                if attn_mask.dtype == torch.bool else attn_mask)
    if bias is not None:
        steps.append(("mask", bias))
        scores = scores + bias
        steps.append(("masked", scores))
    weights = torch.softmax(scores, -1)
    steps += [("weights", weights)]
    return steps


def _gelu(x, approximate="none"):
    import torch

    half = 0.5 * x
    if approximate == "tanh":
        cube = x * x * x
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * cube)
        return [("half", half), ("cube", cube), ("inner", inner), ("tanh", torch.tanh(inner)),
                ("one_plus", 1 + torch.tanh(inner))]
    erf = torch.erf(x / math.sqrt(2))
    return [("half", half), ("scaled", x / math.sqrt(2)), ("erf", erf), ("one_plus", 1 + erf)]


def _batch_norm(x, weight, bias, mean, var, *rest):
    import torch

    eps = next((r for r in reversed(rest) if isinstance(r, float)), 1e-5)
    shape = [1, -1] + [1] * (x.dim() - 2)
    centered = x - mean.reshape(shape)
    normalized = centered * torch.rsqrt(var.reshape(shape) + eps)
    steps = [("centered", centered), ("normalized", normalized)]
    if weight is not None:
        steps.append(("scaled", normalized * weight.reshape(shape)))
    return steps


def _silu(x):
    import torch

    return [("sigmoid", torch.sigmoid(x))]


# aten op -> the steps it is split into, each (name, value) computed from the op's own arguments
FINE_STEPS: dict[str, Callable[..., list]] = {
    "aten.linear": _linear,
    "aten.addmm": _addmm,
    "aten.convolution": _convolution,
    "aten.conv1d": _convolution,
    "aten.conv2d": _convolution,
    "aten.layer_norm": _layer_norm,
    "aten._softmax": _softmax,
    "aten.softmax": _softmax,
    "aten.scaled_dot_product_attention": _attention,
    "aten.gelu": _gelu,
    "aten._native_batch_norm_legit_no_training": _batch_norm,
    "aten.batch_norm": _batch_norm,
    "aten.silu": _silu,
}
