"""Find GELU sites in a PyTorch model from the aten ops it runs.

An nn.Module is run once, eagerly, on the sample inputs, with a dispatch mode recording every aten
call (cheap: no second capture of the model beside the exporter's, and any model that runs can be
read); a saved torch.export program (.pt2) is read from its graph. aten.gelu keeps its
`approximate` kwarg; hand-written formulas (HF gelu_new, quick_gelu) are aten arithmetic,
matched by the shared chain algebra in `chain_graph`. Python scalar arguments and one-element
parameters, buffers and tensor constants are the chains' constants. torch is imported only when
a finder runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from . import chains
from .chain_graph import ChainGraph, OpNode
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
    "aten.relu.default": ("Relu", 1),
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
    "aten.clone.default", "aten.alias.default", "aten.detach.default", "aten.lift_fresh.default",
    "aten.lift_fresh_copy.default",
}


def _out_of_place(target: str) -> str:
    """aten.mul_.Tensor -> aten.mul.Tensor: an eager run calls in-place overloads where torch.export
    shows the functional ones (the recorder renames the tensor an in-place call writes)."""
    parts = target.split(".")
    if len(parts) == 3 and parts[1].endswith("_") and not parts[1].startswith("_"):
        parts[1] = parts[1].rstrip("_")
    return ".".join(parts)


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


@dataclass(frozen=True)
class _Ref:
    """A tensor argument of a call, by its name in the graph being built."""

    name: str


class _Builder:
    """Turns torch op calls (an aten overload on named tensors and python values) into the neutral
    graph the chains read, remembering each node's module stack (path, class name) frames."""

    def __init__(self):
        self.nodes: list[OpNode] = []
        self.constants: dict[str, np.ndarray] = {}
        self.dtypes: dict[str, np.dtype] = {}
        self.alias: dict[str, str] = {}
        self.outputs: list[str] = []
        self.stacks: dict[str, list[tuple[str, str]]] = {}

    def name(self, tensor: str) -> str:
        return self.alias.get(tensor, tensor)

    def typed(self, name: str, value: Any) -> None:
        dtype = _numpy_dtype(value)
        if dtype is not None:
            self.dtypes[name] = dtype

    def operand(self, name: str, k: int, arg: Any) -> str | None:
        """The tensor name of argument k: a tensor, or a python number made a constant."""
        if isinstance(arg, _Ref):
            return self.name(arg.name)
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            constant = f"{name}/arg{k}"
            self.constants[constant] = np.asarray(arg, dtype=np.float64 if isinstance(arg, float) else np.int64)
            return constant
        return None

    def call(self, name: str, target: str, args: tuple, kwargs: dict, value: Any,
             stack: list[tuple[str, str]], outputs: tuple[str, ...] | None = None) -> None:
        """One call of `target` computing `value` (its output, or the output's meta value); its
        tensor arguments are _Refs. `outputs` names the tensors of an op with several."""
        self.stacks[name] = stack
        target = _out_of_place(target)
        if target in _ALIASES:
            self.alias[name] = self.name(args[0].name)
            return
        self.typed(name, value)
        op, arity = _OPS.get(target, (target, 0))
        args, attrs = list(args), {}
        if target == "aten.rsub.Scalar":  # rsub(x, c) = c - x
            op, arity, args = "Sub", 2, [*args[1::-1], *args[2:]]
        elif target == "aten.square.default":
            op, arity, args = "Mul", 2, [args[0], args[0]]
        elif target in _CLAMPS and not any(isinstance(a, _Ref) for a in args[1:]):
            rest = list(args[1:])
            low, high = {
                "aten.clamp_min.default": lambda: (rest[0], None),
                "aten.clamp_max.default": lambda: (None, rest[0]),
                "aten.hardtanh.default": lambda: tuple((rest + [-1.0, 1.0][len(rest):])[:2]),
            }.get(target, lambda: tuple((rest + [None, None])[:2]))()
            op, arity, args = "Clip", 1, args[:1]
            attrs = {"min": kwargs.get("min", low), "max": kwargs.get("max", high)}
        elif target in ("aten.to.dtype", "aten._to_copy.default", "aten.to.dtype_layout"):
            to = _numpy_dtype(value)
            if to is not None:
                op, arity, args, attrs = "Cast", 1, args[:1], {"to": to}
        elif target in ("aten.special_erfc.default", "aten.erfc.default"):  # erfc(z) = 1 - erf(z)
            one = f"{name}/one"
            self.constants[one] = np.ones((), np.float64)
            self.nodes.append(OpNode(name, "Erf", (self.name(args[0].name),), (f"{name}#erf",)))
            self.nodes.append(OpNode(name, "Sub", (one, f"{name}#erf"), (name,)))
            return
        inputs = [self.operand(name, k, a) for k, a in enumerate(args[:arity])]
        extra = {k: v for k, v in kwargs.items() if k not in ("min", "max", "dtype", "approximate")}
        if arity == 0 or len(args) > arity or extra.get("alpha", 1) != 1 or None in inputs or outputs:
            op, inputs, attrs = target, self._all_refs(args, kwargs), {}
        if op == "Gelu":  # the neutral Gelu speaks Gelu-20's approximate: the catalogue translates aten's
            approximate = kwargs.get("approximate", "none")
            found = claimed_by(TORCH, target, {"approximate": approximate})
            attrs = {"approximate": found[0].gelu20_approximate if found else approximate}
        self.nodes.append(OpNode(name, op, tuple(inputs), outputs or (name,), attrs))

    def _all_refs(self, args: Any, kwargs: dict) -> list[str]:
        from torch.utils import _pytree as pytree

        leaves = pytree.tree_leaves((args, kwargs))
        return list(dict.fromkeys(self.name(a.name) for a in leaves if isinstance(a, _Ref)))

    def graph(self) -> ChainGraph:
        return ChainGraph(self.nodes, self.constants, self.outputs, self.dtypes)

    def module_note(self, site: Site) -> str:
        """ "in {module path} ({class})": the innermost module holding every node of the site."""
        stacks = [self.stacks[label] for label in site.nodes]
        common = next((k for k, frames in enumerate(zip(*stacks)) if len(set(frames)) > 1),
                      min(len(s) for s in stacks))
        if common == 0 or not stacks[0][common - 1][0]:
            return ""
        path, cls = stacks[0][common - 1]
        return f"in {path} ({str(cls).rsplit('.', 1)[-1]})"


def _from_program(ep: torch.export.ExportedProgram) -> _Builder:
    """The builder fed from a torch.export program's graph (a saved .pt2)."""
    import torch

    builder = _Builder()
    state = {**ep.state_dict, **ep.constants}
    for spec in ep.graph_signature.input_specs:
        value = _one_element(state.get(spec.target)) if spec.target is not None else None
        if value is not None:
            builder.constants[spec.arg.name] = value

    def refs(arg: Any) -> Any:
        return torch.fx.node.map_arg(arg, lambda node: _Ref(node.name))

    for node in ep.graph.nodes:
        if node.op == "output":
            builder.outputs = [builder.name(n.name) for n in node.all_input_nodes]
        elif node.op == "placeholder":
            builder.typed(node.name, node.meta.get("val"))
        elif node.op == "call_function" and str(node.target) not in _CHECKS:
            builder.call(node.name, str(node.target), refs(node.args), refs(dict(node.kwargs)), node.meta.get("val"),
                         list((node.meta.get("nn_module_stack") or {}).values()))
    return builder


def _recorded(model: torch.nn.Module, args: tuple, kwargs: dict | None) -> _Builder:
    """The builder fed from one eager run of `model`: every aten call the run makes, recorded by a
    dispatch mode as it happens (what torch.export would capture, without tracing the model)."""
    import inspect

    import torch

    builder = _Builder()
    recorder = _Recorder(builder, {id(t): name for name, t in (*model.named_parameters(), *model.named_buffers())},
                         {id(m): path for path, m in model.named_modules() if path})
    try:
        bound = inspect.signature(model.forward).bind(*args, **(kwargs or {}))
        named = [(name, value) for name, value in bound.arguments.items()]
    except (TypeError, ValueError):
        named = [(f"input_{i}", value) for i, value in enumerate(args)] + list((kwargs or {}).items())
    from torch.utils import _pytree as pytree

    for name, value in named:
        leaves = [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]
        for k, tensor in enumerate(leaves):
            recorder.input(tensor, name if len(leaves) == 1 else f"{name}_{k}")
    with torch.no_grad(), recorder.hooks(), recorder.recording():
        result = model(*args, **(kwargs or {}))
    builder.outputs = [recorder.read(t) for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
    return builder


class _Recorder:
    """Names each tensor a recorded call produces (fx style: mul, mul_1) and feeds the call to the
    builder with the modules on the call stack at the time (from global module hooks).

    Tensors are known by identity while they live. An in-place op renames the tensor it writes; a
    tensor read after a write through another view of its storage (its version changed) reads as
    that write's output, so what flows through views written in place stays connected."""

    def __init__(self, builder: _Builder, leaf_names: dict[int, str], module_paths: dict[int, str]):
        from torch.utils.weak import WeakIdKeyDictionary

        self.builder, self.leaf_names, self.module_paths = builder, leaf_names, module_paths
        self.names: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor -> (name, its version then)
        self.writes: dict[int, str] = {}  # storage address -> the last in-place call on it
        self.taken: set[str] = set()
        self.counts: dict[str, int] = {}
        self.stack: list[tuple[str, str] | None] = []

    def fresh(self, base: str) -> str:
        count = self.counts.get(base, 0)
        name = base if count == 0 else f"{base}_{count}"
        while name in self.taken:
            count += 1
            name = f"{base}_{count}"
        self.counts[base] = count + 1
        self.taken.add(name)
        return name

    def input(self, tensor, name: str) -> None:
        self.taken.add(name)
        self.names[tensor] = (name, _version(tensor))
        self.builder.typed(name, tensor)

    def read(self, tensor) -> str:
        known = self.names.get(tensor)
        version = _version(tensor)
        if known is not None and known[1] == version:
            return known[0]
        written = self.writes.get(_storage(tensor))
        if known is not None and written is not None:
            name = written
        elif known is not None:
            name = known[0]
        else:  # a parameter, buffer or constant the run did not produce
            name = self.fresh(self.leaf_names.get(id(tensor), "tensor"))
            value = _one_element(tensor)
            if value is not None:
                self.builder.constants[name] = value
            self.builder.typed(name, tensor)
        self.names[tensor] = (name, version)
        return name

    @contextlib.contextmanager
    def recording(self):
        """Every aten call made inside goes through `call`."""
        with _dispatch_mode_class()(self):
            yield

    def call(self, func, args: tuple, kwargs: dict):
        import torch
        from torch.utils import _pytree as pytree

        refs = pytree.tree_map_only(torch.Tensor, lambda t: _Ref(self.read(t)), (args, kwargs))
        out = func(*args, **kwargs)
        target = str(func)
        if target in _CHECKS:
            return out
        name = self.fresh(func.overloadpacket.__name__)
        tensors = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        outputs = tuple(f"{name}#{k}" for k in range(len(tensors))) if not isinstance(out, torch.Tensor) else None
        stack = [frame for frame in self.stack if frame is not None]
        self.builder.call(name, target, *refs, out if isinstance(out, torch.Tensor) else None, stack, outputs)
        for tensor, produced in zip(tensors, outputs or (name,)):
            self.names[tensor] = (self.builder.name(produced), _version(tensor))
        for written in _written_arguments(func, args, kwargs):
            self.writes[_storage(written)] = self.builder.name(name)
            self.names[written] = (self.builder.name(name), _version(written))
        return out

    @contextlib.contextmanager
    def hooks(self):
        from torch.nn.modules import module as nn_module

        def enter(module, _args):
            path = self.module_paths.get(id(module))
            cls = type(module)
            self.stack.append((path, f"{cls.__module__}.{cls.__qualname__}") if path else None)

        def leave(module, _args, _result):
            if self.stack:
                self.stack.pop()

        handles = [nn_module.register_module_forward_pre_hook(enter),
                   nn_module.register_module_forward_hook(leave, always_call=True)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


@functools.cache
def _dispatch_mode_class():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recording(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False  # it runs eagerly: no torch._dynamo wrapper, whose first call imports dynamo (1 s)

        def __init__(self, recorder: _Recorder):
            super().__init__()
            self.recorder = recorder

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return self.recorder.call(func, args, kwargs or {})

    return Recording


def _version(tensor) -> int:
    try:
        return tensor._version
    except RuntimeError:  # an inference-mode tensor has no version counter
        return 0


def _storage(tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except RuntimeError:
        return id(tensor)


def _written_arguments(func, args: tuple, kwargs: dict) -> list:
    """The tensors a call writes in place (its schema's mutable arguments)."""
    import torch

    written = []
    for k, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[k] if k < len(args) else kwargs.get(argument.name)
        if isinstance(value, torch.Tensor):
            written.append(value)
    return written


def is_exported_program(obj: Any) -> bool:
    """Whether `obj` is a torch.export ExportedProgram, without importing torch.export (about 0.5 s
    with sympy): a program exists only once its module is imported."""
    module = sys.modules.get("torch.export")
    return module is not None and isinstance(obj, module.ExportedProgram)


def _builder_for(model: Any, args: tuple, kwargs: dict | None) -> _Builder:
    if is_exported_program(model):
        return _from_program(model)
    return _recorded(model, args, kwargs)


def _with_context(site: Site, builder: _Builder, op: str | None = None) -> Site:
    note = "; ".join(part for part in (site.note, builder.module_note(site)) if part)
    return dataclasses.replace(site, op=op or site.op, note=note)


def find_torch_sites(model: Any, args: tuple, kwargs: dict | None = None) -> list[Site]:
    """Every GELU site of a torch.nn.Module (exported with args/kwargs) or ExportedProgram.

    Sites are in execution order with ids "{k}:{fx node}"; a one-node GELU is op "aten.gelu",
    chains are "erf-chain", "tanh-chain" or "sigmoid-chain". Notes add the module holding the
    site, e.g. "approximate='tanh'; in encoder.layers.0.mlp.act (GELU)".
    """
    builder = _builder_for(model, args, kwargs)
    graph = builder.graph()
    return [_with_context(s, builder, "aten.gelu" if s.op == "Gelu" else None) for s in chains.find_sites(graph)]


def find_torch_relu_sites(model: Any, args: tuple, kwargs: dict | None = None) -> list[Site]:
    """aten.relu nodes (nn.ReLU, F.relu, torch.relu) as sites claimed relu, ids "relu:{k}:{fx node}"."""
    builder = _builder_for(model, args, kwargs)
    graph = builder.graph()
    return [_with_context(s, builder) for s in chains.find_relu_sites(graph, "aten.relu")]


def torch_activation_sites(model: Any, args: tuple, kwargs: dict | None = None) -> list[Site]:
    """GELU and ReLU sites together in execution order, from one torch.export."""
    builder = _builder_for(model, args, kwargs)
    graph = builder.graph()
    return [
        _with_context(s, builder, "aten.gelu" if s.op == "Gelu" else None)
        for s in chains.find_activation_sites(graph, "aten.relu")
    ]
