"""Find GELU sites in a PyTorch model, from its torch.export graph (ATen ops, not decomposed).

aten.gelu keeps its `approximate` kwarg; hand-written formulas (HF gelu_new, quick_gelu) are
aten arithmetic, matched by the shared chain algebra in `chains`. Python scalar arguments and
one-element parameters, buffers and lifted tensor constants are the chains' constants.
torch is imported only when a finder runs.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from . import chains
from .catalogue import TORCH, Site, claimed_by

if TYPE_CHECKING:
    import torch

# aten overload -> (neutral op, how many leading args are its inputs)
_OPS = {
    "aten.mul.Tensor": ("Mul", 2), "aten.mul.Scalar": ("Mul", 2),
    "aten.div.Tensor": ("Div", 2), "aten.div.Scalar": ("Div", 2),
    "aten.add.Tensor": ("Add", 2), "aten.add.Scalar": ("Add", 2),
    "aten.sub.Tensor": ("Sub", 2), "aten.sub.Scalar": ("Sub", 2),
    "aten.neg.default": ("Neg", 1),
    "aten.pow.Tensor_Scalar": ("Pow", 2), "aten.pow.Tensor_Tensor": ("Pow", 2),
    "aten.tanh.default": ("Tanh", 1),
    "aten.erf.default": ("Erf", 1), "aten.special_erf.default": ("Erf", 1),
    "aten.sigmoid.default": ("Sigmoid", 1),
    "aten.gelu.default": ("Gelu", 1),
    "aten.relu.default": ("Relu", 1), "aten.relu_.default": ("Relu", 1),
    "aten.silu.default": ("Silu", 1), "aten.exp.default": ("Exp", 1), "aten.abs.default": ("Abs", 1),
    "aten.sign.default": ("Sign", 1),
    "aten.sqrt.default": ("Sqrt", 1), "aten.log.default": ("Log", 1), "aten.reciprocal.default": ("Reciprocal", 1),
    "aten.minimum.default": ("Min", 2), "aten.maximum.default": ("Max", 2),
}
_CLAMPS = ("aten.clamp.default", "aten.clamp_min.default", "aten.clamp_max.default", "aten.hardtanh.default")
# Ops that only check their input: left out, so they do not count as its consumers.
_CHECKS = {"aten._assert_tensor_metadata.default", "aten._assert_scalar.default"}
# Ops whose output is their first input's value.
_ALIASES = {
    "aten.clone.default", "aten.alias.default", "aten.detach.default", "aten.detach_.default",
    "aten.lift_fresh_copy.default",
}


def _exported(model: Any, args: tuple, kwargs: dict | None) -> torch.export.ExportedProgram:
    import torch

    if isinstance(model, torch.export.ExportedProgram):
        return model
    try:
        return torch.export.export(model, args, kwargs)
    except Exception as first:  # noqa: BLE001 - the non-strict capture failed: try TorchDynamo's
        try:
            return torch.export.export(model, args, kwargs, strict=True)
        except Exception:  # noqa: BLE001
            raise first from None


def _one_element(value: Any) -> np.ndarray | None:
    """A one-element tensor as numpy (bfloat16 as ml_dtypes.bfloat16), else None."""
    import torch

    if not isinstance(value, torch.Tensor) or value.numel() != 1 or value.is_complex() or value.is_quantized:
        return None
    value = value.detach().cpu()
    if value.dtype == torch.bfloat16:
        return value.float().numpy().astype(ml_dtypes.bfloat16)
    return value.numpy()


def _numpy_dtype(value: Any) -> np.dtype | None:
    """The numpy dtype of a node's tensor value (bfloat16 as ml_dtypes'), None when not a float."""
    import torch

    dtype = getattr(value, "dtype", None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        return None
    if dtype == torch.bfloat16:
        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(torch.empty((), dtype=dtype).numpy().dtype)
    except TypeError:  # float8: no numpy dtype
        return None


class _Builder:
    """Turns an ExportedProgram's graph into a ChainGraph, remembering each node's module stack."""

    def __init__(self, ep: torch.export.ExportedProgram):
        self.nodes: list[chains.OpNode] = []
        self.constants: dict[str, np.ndarray] = {}
        self.dtypes: dict[str, np.dtype] = {}
        self.alias: dict[str, str] = {}
        self.outputs: list[str] = []
        self.stacks: dict[str, list[tuple[str, str]]] = {}
        state = {**ep.state_dict, **ep.constants}
        for spec in ep.graph_signature.input_specs:
            value = _one_element(state.get(spec.target)) if spec.target is not None else None
            if value is not None:
                self.constants[spec.arg.name] = value
        for node in ep.graph.nodes:
            self.add(node)

    def name(self, node: torch.fx.Node) -> str:
        return self.alias.get(node.name, node.name)

    def operand(self, node: torch.fx.Node, k: int, arg: Any) -> str | None:
        """The tensor name of argument k: a node, or a python number made a constant."""
        import torch

        if isinstance(arg, torch.fx.Node):
            return self.name(arg)
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            name = f"{node.name}/arg{k}"
            self.constants[name] = np.asarray(arg, dtype=np.float64 if isinstance(arg, float) else np.int64)
            return name
        return None

    def add(self, node: torch.fx.Node) -> None:
        import torch

        target = str(node.target)
        if node.op == "output":
            self.outputs = [self.name(n) for n in node.all_input_nodes]
            return
        if node.op == "placeholder":
            self._typed(node)
        if node.op != "call_function" or target in _CHECKS:
            return
        self.stacks[node.name] = list((node.meta.get("nn_module_stack") or {}).values())
        if target in _ALIASES:
            self.alias[node.name] = self.name(node.args[0])
            return
        self._typed(node)
        op, arity = _OPS.get(target, (target, 0))
        args, attrs = list(node.args), {}
        if target == "aten.rsub.Scalar":  # rsub(x, c) = c - x
            op, arity, args = "Sub", 2, [*args[1::-1], *args[2:]]
        elif target == "aten.square.default":
            op, arity, args = "Mul", 2, [args[0], args[0]]
        elif target in _CLAMPS and not any(isinstance(a, torch.fx.Node) for a in args[1:]):
            rest = list(args[1:])
            low, high = {
                "aten.clamp_min.default": lambda: (rest[0], None),
                "aten.clamp_max.default": lambda: (None, rest[0]),
                "aten.hardtanh.default": lambda: tuple((rest + [-1.0, 1.0][len(rest):])[:2]),
            }.get(target, lambda: tuple((rest + [None, None])[:2]))()
            op, arity, args = "Clip", 1, args[:1]
            attrs = {"min": node.kwargs.get("min", low), "max": node.kwargs.get("max", high)}
        elif target in ("aten.to.dtype", "aten._to_copy.default", "aten.to.dtype_layout"):
            to = _numpy_dtype(node.meta.get("val"))
            if to is not None:
                op, arity, args, attrs = "Cast", 1, args[:1], {"to": to}
        elif target in ("aten.special_erfc.default", "aten.erfc.default"):  # erfc(z) = 1 - erf(z)
            one = f"{node.name}/one"
            self.constants[one] = np.ones((), np.float64)
            self.nodes.append(chains.OpNode(node.name, "Erf", (self.name(args[0]),), (f"{node.name}#erf",)))
            self.nodes.append(chains.OpNode(node.name, "Sub", (one, f"{node.name}#erf"), (node.name,)))
            return
        inputs = [self.operand(node, k, a) for k, a in enumerate(args[:arity])]
        extra = {k: v for k, v in node.kwargs.items() if k not in ("min", "max", "dtype", "approximate")}
        if arity == 0 or len(args) > arity or extra.get("alpha", 1) != 1 or None in inputs:
            op, inputs, attrs = target, [self.name(n) for n in node.all_input_nodes], {}
        if op == "Gelu":  # the neutral Gelu speaks Gelu-20's approximate: the catalogue translates aten's
            approximate = node.kwargs.get("approximate", "none")
            found = claimed_by(TORCH, target, {"approximate": approximate})
            attrs = {"approximate": found[0].gelu20_approximate if found else approximate}
        self.nodes.append(chains.OpNode(node.name, op, tuple(inputs), (node.name,), attrs))

    def _typed(self, node: torch.fx.Node) -> None:
        dtype = _numpy_dtype(node.meta.get("val"))
        if dtype is not None:
            self.dtypes[node.name] = dtype

    def module_note(self, site: Site) -> str:
        """ "in {module path} ({class})": the innermost module holding every node of the site."""
        stacks = [self.stacks[label] for label in site.nodes]
        common = next((k for k, frames in enumerate(zip(*stacks)) if len(set(frames)) > 1),
                      min(len(s) for s in stacks))
        if common == 0 or not stacks[0][common - 1][0]:
            return ""
        path, cls = stacks[0][common - 1]
        return f"in {path} ({str(cls).rsplit('.', 1)[-1]})"


def _with_context(site: Site, builder: _Builder, op: str | None = None) -> Site:
    note = "; ".join(part for part in (site.note, builder.module_note(site)) if part)
    return dataclasses.replace(site, op=op or site.op, note=note)


def find_torch_sites(model: Any, args: tuple, kwargs: dict | None = None) -> list[Site]:
    """Every GELU site of a torch.nn.Module (exported with args/kwargs) or ExportedProgram.

    Sites are in execution order with ids "{k}:{fx node}"; a one-node GELU is op "aten.gelu",
    chains are "erf-chain", "tanh-chain" or "sigmoid-chain". Notes add the module holding the
    site, e.g. "approximate='tanh'; in encoder.layers.0.mlp.act (GELU)".
    """
    builder = _Builder(_exported(model, args, kwargs))
    graph = chains.ChainGraph(builder.nodes, builder.constants, builder.outputs, builder.dtypes)
    return [_with_context(s, builder, "aten.gelu" if s.op == "Gelu" else None) for s in chains.find_sites(graph)]


def find_torch_relu_sites(model: Any, args: tuple, kwargs: dict | None = None) -> list[Site]:
    """aten.relu nodes (nn.ReLU, F.relu, torch.relu) as sites claimed relu, ids "relu:{k}:{fx node}"."""
    builder = _Builder(_exported(model, args, kwargs))
    graph = chains.ChainGraph(builder.nodes, builder.constants, builder.outputs, builder.dtypes)
    return [_with_context(s, builder) for s in chains.find_relu_sites(graph, "aten.relu")]


def torch_activation_sites(model: Any, args: tuple, kwargs: dict | None = None) -> list[Site]:
    """GELU and ReLU sites together in execution order, from one torch.export."""
    builder = _Builder(_exported(model, args, kwargs))
    graph = chains.ChainGraph(builder.nodes, builder.constants, builder.outputs, builder.dtypes)
    return [
        _with_context(s, builder, "aten.gelu" if s.op == "Gelu" else None)
        for s in chains.find_activation_sites(graph, "aten.relu")
    ]
