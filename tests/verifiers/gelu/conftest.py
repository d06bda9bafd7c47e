"""Real torch.onnx exports and hand-built ONNX graphs shared by the GELU tests."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper


def gelu_new(x: torch.Tensor, cubic: float = 0.044715) -> torch.Tensor:
    """HF gelu_new (GPT-2, T5), written out with torch.pow."""
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + cubic * torch.pow(x, 3))))


ACTIVATIONS = {
    "nn_gelu_none": lambda: torch.nn.GELU(),
    "nn_gelu_tanh": lambda: torch.nn.GELU(approximate="tanh"),
    "f_gelu": lambda: _Lambda(F.gelu),
    "gelu_new": lambda: _Lambda(gelu_new),
    "quick_gelu": lambda: _Lambda(lambda x: x * torch.sigmoid(1.702 * x)),
    "silu": lambda: _Lambda(lambda x: x * torch.sigmoid(x)),
    "relu": lambda: torch.nn.ReLU(),
}


class _Lambda(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class _Mlp(torch.nn.Module):
    def __init__(self, activation: torch.nn.Module):
        super().__init__()
        self.up, self.act, self.down = torch.nn.Linear(8, 16), activation, torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


@pytest.fixture(scope="session")
def torch_onnx(tmp_path_factory):
    """export(kind, opset, dynamo, mlp=False) -> ModelProto, cached for the session.

    A bare activation maps input "x" to output "y"; mlp=True wraps it as Linear-act-Linear
    on a (1, 4, 8) input, the shape onnxruntime's transformer optimizer fuses.
    """
    cache: dict[tuple, onnx.ModelProto] = {}
    folder = tmp_path_factory.mktemp("torch_onnx")

    def export(kind: str, opset: int = 17, dynamo: bool = False, mlp: bool = False) -> onnx.ModelProto:
        key = (kind, opset, dynamo, mlp)
        if key not in cache:
            torch.manual_seed(0)
            module = ACTIVATIONS[kind]()
            module, sample = (_Mlp(module), torch.randn(1, 4, 8)) if mlp else (module, torch.randn(2, 8))
            path = folder / f"{kind}_{opset}_{'dynamo' if dynamo else 'ts'}_{'mlp' if mlp else 'act'}.onnx"
            torch.onnx.export(module.eval(), (sample,), str(path), opset_version=opset, dynamo=dynamo,
                              input_names=["x"], output_names=["y"])
            cache[key] = onnx.load(str(path))
        return cache[key]

    return export


@pytest.fixture(scope="session")
def optimized(torch_onnx):
    """optimize(kind, opset, opt_level, approximate) -> onnxruntime.transformers-optimized MLP.

    optimize_model rewrites a ModelProto in place, so it gets a copy.
    """
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    def optimize(kind: str, opset: int, opt_level: int, approximate: bool) -> onnx.ModelProto:
        model = onnx.ModelProto()
        model.CopyFrom(torch_onnx(kind, opset, dynamo=False, mlp=True))
        options = FusionOptions("bert")
        options.enable_gelu_approximation = approximate
        return optimize_model(model, model_type="bert", opt_level=opt_level, optimization_options=options).model

    return optimize


def scalar(name: str, value: float, dtype=np.float32) -> TensorProto:
    return numpy_helper.from_array(np.array(value, dtype=dtype), name)


def graph_model(nodes, initializers=(), opset: int = 17, elem_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """A model from input "x" to output "y" holding the given nodes (com.microsoft imported)."""
    graph = helper.make_graph(
        nodes, "handmade",
        [helper.make_tensor_value_info("x", elem_type, ["n", 8])],
        [helper.make_tensor_value_info("y", elem_type, ["n", 8])],
        list(initializers),
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)], ir_version=10
    )
    onnx.checker.check_model(model)
    return model


def tanh_chain(cubic: float) -> onnx.ModelProto:
    """TorchScript-ordered tanh GELU with the given x^3 coefficient, constants as initializers."""
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["x2"], name="sq"),
        helper.make_node("Mul", ["x", "x2"], ["x3"], name="cube"),
        helper.make_node("Mul", ["c_cubic", "x3"], ["cx3"], name="mul_cubic"),
        helper.make_node("Add", ["x", "cx3"], ["inner"], name="add_x"),
        helper.make_node("Mul", ["c_scale", "inner"], ["arg"], name="mul_scale"),
        helper.make_node("Tanh", ["arg"], ["t"], name="tanh"),
        helper.make_node("Add", ["c_one", "t"], ["onep"], name="add_one"),
        helper.make_node("Mul", ["x", "onep"], ["xt"], name="mul_x"),
        helper.make_node("Mul", ["c_half", "xt"], ["y"], name="mul_half"),
    ]
    inits = [scalar("c_cubic", cubic), scalar("c_scale", math.sqrt(2 / math.pi)),
             scalar("c_one", 1.0), scalar("c_half", 0.5)]
    return graph_model(nodes, inits)


def erfc_chain(negate_with_node: bool) -> onnx.ModelProto:
    """tf2onnx's Keras exact GELU 0.5*x*erfc(-x/sqrt2), erfc lowered as 1 - erf."""
    if negate_with_node:
        arg = [helper.make_node("Neg", ["x"], ["neg_x"], name="neg"),
               helper.make_node("Mul", ["neg_x", "c_scale"], ["arg"], name="mul_scale")]
        scale = 1 / math.sqrt(2)
    else:
        arg = [helper.make_node("Mul", ["x", "c_scale"], ["arg"], name="mul_scale")]
        scale = -1 / math.sqrt(2)
    nodes = [
        helper.make_node("Mul", ["c_half", "x"], ["half_x"], name="mul_half"),
        *arg,
        helper.make_node("Erf", ["arg"], ["e"], name="erf"),
        helper.make_node("Sub", ["c_one", "e"], ["erfc"], name="one_minus"),
        helper.make_node("Mul", ["half_x", "erfc"], ["y"], name="mul_out"),
    ]
    return graph_model(nodes, [scalar("c_half", 0.5), scalar("c_scale", scale), scalar("c_one", 1.0)])


def microsoft_op(op_type: str, bias: np.ndarray | None = None, **attrs) -> onnx.ModelProto:
    """One com.microsoft activation node, with an optional bias initializer."""
    inputs, inits = ["x"], []
    if bias is not None:
        inputs.append("bias")
        inits.append(numpy_helper.from_array(bias.astype(np.float32), "bias"))
    node = helper.make_node(op_type, inputs, ["y"], name=op_type.lower(), domain="com.microsoft", **attrs)
    return graph_model([node], inits)


@pytest.fixture
def handmade():
    """Builders for hand-made graphs: tanh_chain, erfc_chain, microsoft_op, graph_model, scalar."""
    return SimpleNamespace(tanh_chain=tanh_chain, erfc_chain=erfc_chain, microsoft_op=microsoft_op,
                           graph_model=graph_model, scalar=scalar)
