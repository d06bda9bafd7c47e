"""Find GELU sites in a Keras 3 model (TensorFlow backend), from its traced TF graph.

The model is traced with tf.function for an input signature; the concrete function's GraphDef
becomes a neutral `chain_graph.ChainGraph`. TF has no GELU op: every spelling is arithmetic,
matched by the shared chain algebra. Exact GELU is 0.5*x*erfc(-x/sqrt2) in TF 2.21; Erfc(z) is
expanded to 1 - Erf(z) so the erf-chain matcher claims it. Identity/IdentityN are looked
through, Cast of a scalar constant is a constant, and function calls ((Stateful)PartitionedCall,
e.g. a tf.function called inside a layer) are inlined as "{call node}/{body node}".
tensorflow is imported only when a finder runs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from . import chains
from .chain_graph import ChainGraph, OpNode
from .catalogue import Site

if TYPE_CHECKING:
    import tensorflow as tf

_OPS = {
    "Mul": "Mul", "RealDiv": "Div", "Div": "Div", "AddV2": "Add", "Add": "Add", "Sub": "Sub",
    "Neg": "Neg", "Pow": "Pow", "Tanh": "Tanh", "Erf": "Erf", "Sigmoid": "Sigmoid", "Relu": "Relu",
    "Exp": "Exp", "Abs": "Abs", "Sign": "Sign", "Sqrt": "Sqrt", "Log": "Log", "Softplus": "Softplus",
    "Reciprocal": "Reciprocal", "Inv": "Reciprocal", "Minimum": "Min", "Maximum": "Max",
    "ClipByValue": "Clip",
}
_ALIASES = ("Identity", "IdentityN", "StopGradient", "Snapshot")
_CALLS = ("PartitionedCall", "StatefulPartitionedCall")


def _tensor(ref: str, prefix: str) -> str | None:
    """A GraphDef or FunctionDef input reference as "{node}" or "{node}:{k}"; None for control inputs.

    "n", "n:0" and a function body's "n:z:0" all name output 0 of n.
    """
    if ref.startswith("^"):
        return None
    name, *rest = ref.split(":")
    index = int(rest[-1]) if rest else 0
    return f"{prefix}{name}" + (f":{index}" if index else "")


def _numpy_dtype(type_enum: int) -> np.dtype | None:
    """The numpy dtype of a TF type (bfloat16 is ml_dtypes'); None when not a number."""
    import tensorflow as tf

    dtype = tf.dtypes.as_dtype(type_enum)
    return np.dtype(dtype.as_numpy_dtype) if dtype.is_floating or dtype.is_integer else None


class _Builder:
    """Flattens a GraphDef (inlining called functions) into neutral nodes and scalar constants."""

    def __init__(self, graph_def: Any):
        self.functions = {f.signature.name: f for f in graph_def.library.function}
        self.nodes: list[OpNode] = []
        self.constants: dict[str, np.ndarray] = {}
        self.dtypes: dict[str, np.dtype] = {}
        self.alias: dict[str, str] = {}
        self.add(graph_def.node, "")

    def name(self, tensor: str) -> str:
        return self.alias.get(tensor, tensor)

    def add(self, node_defs: Any, prefix: str) -> None:
        import tensorflow as tf

        for nd in node_defs:
            name = prefix + nd.name
            inputs = [self.name(t) for ref in nd.input if (t := _tensor(ref, prefix))]
            for key in ("DstT", "T", "dtype"):
                if key in nd.attr and nd.attr[key].type:
                    dtype = _numpy_dtype(nd.attr[key].type)
                    if dtype is not None and dtype.kind == "f":
                        self.dtypes[name] = dtype
                    break
            if nd.op in _ALIASES:
                self.alias.update({name if k == 0 else f"{name}:{k}": t for k, t in enumerate(inputs)})
            elif nd.op == "Const":
                tensor, dtype = nd.attr["value"].tensor, _numpy_dtype(nd.attr["dtype"].type)
                if dtype is not None and math.prod(d.size for d in tensor.tensor_shape.dim) == 1:
                    self.constants[name] = tf.make_ndarray(tensor).astype(dtype)
            elif nd.op == "Cast" and inputs[0] in self.constants:
                dtype = _numpy_dtype(nd.attr["DstT"].type)
                if dtype is not None:
                    self.constants[name] = self.constants[inputs[0]].astype(dtype)
            elif nd.op == "Cast":
                dtype = _numpy_dtype(nd.attr["DstT"].type)
                op = "Cast" if dtype is not None else "Cast(non-numeric)"
                self.nodes.append(OpNode(name, op, tuple(inputs), (name,), {"to": dtype}))
            elif nd.op in _CALLS and nd.attr["f"].func.name in self.functions:
                self.inline(self.functions[nd.attr["f"].func.name], name, inputs)
            elif nd.op == "Erfc":  # erfc(z) = 1 - erf(z)
                one = f"{name}#one"
                self.constants[one] = np.ones((), _numpy_dtype(nd.attr["T"].type))
                self.nodes.append(OpNode(name, "Erf", tuple(inputs), (f"{name}#erf",)))
                self.nodes.append(OpNode(name, "Sub", (one, f"{name}#erf"), (name,)))
            elif nd.op == "Square":
                self.nodes.append(OpNode(name, "Mul", (inputs[0], inputs[0]), (name,)))
            else:
                self.nodes.append(OpNode(name, _OPS.get(nd.op, nd.op), tuple(inputs), (name,)))

    def inline(self, fdef: Any, name: str, inputs: list[str]) -> None:
        """A function call's body, its arguments bound to the call's inputs, its results to its outputs."""
        prefix = f"{name}/"
        self.alias.update({prefix + arg.name: t for arg, t in zip(fdef.signature.input_arg, inputs)})
        self.add(fdef.node_def, prefix)
        for k, out in enumerate(fdef.signature.output_arg):
            self.alias[name if k == 0 else f"{name}:{k}"] = self.name(_tensor(fdef.ret[out.name], prefix))


def _chain_graph(model: Any, input_signature: list[tf.TensorSpec], call: Any = None) -> ChainGraph:
    """The traced graph of `call` (positional tensors in input_signature's order), by default the
    model called on one tensor or a list, in inference mode."""
    import tensorflow as tf

    call = call or (lambda *a: model(a[0] if len(a) == 1 else list(a), training=False))
    concrete = tf.function(call).get_concrete_function(*input_signature)
    builder = _Builder(concrete.graph.as_graph_def())
    outputs = [builder.name(_tensor(t.name, "")) for t in concrete.outputs]
    return ChainGraph(builder.nodes, builder.constants, outputs, builder.dtypes)


def find_keras_sites(model: Any, input_signature: list[tf.TensorSpec]) -> list[Site]:
    """Every GELU site of a Keras model traced for input_signature, in graph order.

    Ids are "{k}:{first TF node}"; node names carry the layer path ("functional_1/dense_1/Gelu/...").
    """
    return chains.find_sites(_chain_graph(model, input_signature))


def find_keras_relu_sites(model: Any, input_signature: list[tf.TensorSpec]) -> list[Site]:
    """Relu ops (ReLU layers, activation='relu') as sites claimed relu, ids "relu:{k}:{TF node}"."""
    return chains.find_relu_sites(_chain_graph(model, input_signature), "Relu")


def keras_activation_sites(model: Any, input_signature: list[tf.TensorSpec], call: Any = None) -> list[Site]:
    """GELU, SiLU and ReLU sites together in graph order, from one trace (of `call`, when given:
    a function of the inputs in input_signature's order)."""
    return chains.find_activation_sites(_chain_graph(model, input_signature, call), "Relu")
