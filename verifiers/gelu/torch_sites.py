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
from .catalogue import Site

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
}
# Ops whose output is their first input's value.
_ALIASES = {
    "aten.clone.default", "aten.alias.default", "aten.detach.default", "aten.detach_.default",
    "aten.lift_fresh_copy.default",
}


def _exported(model: Any, args: tuple, kwargs: dict | None) -> torch.export.ExportedProgram:
    import torch

    if isinstance(model, torch.export.ExportedProgram):
        return model
    return torch.export.export(model, args, kwargs)


def _one_element(value: Any) -> np.ndarray | None:
    """A one-element tensor as numpy (bfloat16 as ml_dtypes.bfloat16), else None."""
    import torch

    if not isinstance(value, torch.Tensor) or value.numel() != 1 or value.is_complex() or value.is_quantized:
        return None
    value = value.detach().cpu()
    if value.dtype == torch.bfloat16:
        return value.float().numpy().astype(ml_dtypes.bfloat16)
    return value.numpy()


class _Builder:
    """Turns an ExportedProgram's graph into a ChainGraph, remembering each node's module stack."""

    def __init__(self, ep: torch.export.ExportedProgram):
        self.nodes: list[chains.OpNode] = []
        self.constants: dict[str, np.ndarray] = {}
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
        target = str(node.target)
        if node.op == "output":
            self.outputs = [self.name(n) for n in node.all_input_nodes]
            return
        if node.op != "call_function":
            return
        self.stacks[node.name] = list((node.meta.get("nn_module_stack") or {}).values())
        if target in _ALIASES:
            self.alias[node.name] = self.name(node.args[0])
            return
        op, arity = _OPS.get(target, (target, 0))
        args = list(node.args)
        if target == "aten.rsub.Scalar":  # rsub(x, c) = c - x
            op, arity, args = "Sub", 2, [*args[1::-1], *args[2:]]
        elif target == "aten.square.default":
            op, arity, args = "Mul", 2, [args[0], args[0]]
        inputs = [self.operand(node, k, a) for k, a in enumerate(args[:arity])]
        if arity == 0 or len(args) > arity or node.kwargs.get("alpha", 1) != 1 or None in inputs:
            op, inputs = target, [self.name(n) for n in node.all_input_nodes]
        attrs = {"approximate": node.kwargs.get("approximate", "none")} if op == "Gelu" else {}
        self.nodes.append(chains.OpNode(node.name, op, tuple(inputs), (node.name,), attrs))

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
    graph = chains.ChainGraph(builder.nodes, builder.constants, builder.outputs)
    return [_with_context(s, builder, "aten.gelu" if s.op == "Gelu" else None) for s in chains.find_sites(graph)]


def find_torch_relu_sites(model: Any, args: tuple, kwargs: dict | None = None) -> list[Site]:
    """aten.relu nodes (nn.ReLU, F.relu, torch.relu) as sites claimed relu, ids "relu:{k}:{fx node}"."""
    builder = _Builder(_exported(model, args, kwargs))
    graph = chains.ChainGraph(builder.nodes, builder.constants, builder.outputs)
    return [_with_context(s, builder) for s in chains.find_relu_sites(graph, "aten.relu")]


def torch_activation_sites(model: Any, args: tuple, kwargs: dict | None = None) -> list[Site]:
    """GELU and ReLU sites together in execution order, from one torch.export."""
    builder = _Builder(_exported(model, args, kwargs))
    graph = chains.ChainGraph(builder.nodes, builder.constants, builder.outputs)
    return [
        _with_context(s, builder, "aten.gelu" if s.op == "Gelu" else None)
        for s in chains.find_activation_sites(graph, "aten.relu")
    ]
