"""The ONNX GELU site finder on real torch.onnx exports, optimizer output and hand-built graphs."""

import math

import numpy as np
import onnx
import pytest
import torch
import transformers
from onnx import helper
from onnxruntime.transformers.float16 import convert_float_to_float16

from verifiers.gelu import EXACT, QUICK, RELU, TANH, UNKNOWN
from verifiers.formats.onnx.gelu_sites import find_gelu_sites, find_relu_sites

OPSETS = [13, 17, 18, 20]
EXPORTERS = [pytest.param(False, id="torchscript"), pytest.param(True, id="dynamo")]
# kind -> (claimed flavour, op below opset 20, op at opset 20)
EXPECTED = {
    "nn_gelu_none": (EXACT, "erf-chain", "Gelu"),
    "nn_gelu_tanh": (TANH, "tanh-chain", "Gelu"),
    "f_gelu": (EXACT, "erf-chain", "Gelu"),
    "gelu_new": (TANH, "tanh-chain", "tanh-chain"),
    "quick_gelu": (QUICK, "sigmoid-chain", "sigmoid-chain"),
}


def compute_nodes(model: onnx.ModelProto) -> list[str]:
    return [n.name for n in model.graph.node if n.op_type != "Constant"]


# Every exporter at every opset; the dynamo exporter's 13 and 18 (its own opset, and a
# conversion further down than 17's) are the slow suite's.
EXPORTS = [pytest.param(opset, *exporter.values, id=f"{opset}-{exporter.id}",
                        marks=[pytest.mark.slow] if exporter.values[0] and opset in (13, 18) else [])
           for opset in OPSETS for exporter in EXPORTERS]


@pytest.mark.parametrize(("opset", "dynamo"), EXPORTS)
@pytest.mark.parametrize("kind", EXPECTED)
def test_finds_the_one_gelu_of_every_torch_export(torch_onnx, kind, opset, dynamo):
    model = torch_onnx(kind, opset, dynamo)
    claimed, chain_op, fused_op = EXPECTED[kind]
    [site] = find_gelu_sites(model)
    assert site.claimed == claimed
    assert site.op == (fused_op if opset >= 20 else chain_op)
    assert (site.input, site.output) == ("x", "y")
    assert list(site.nodes) == compute_nodes(model)
    assert site.site_id == f"0:{site.nodes[0]}"


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_site_tensors_are_the_ones_between_the_linears(torch_onnx, dynamo):
    model = torch_onnx("nn_gelu_tanh", 17, dynamo, mlp=True)
    [site] = find_gelu_sites(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers = [n for n in model.graph.node if site.output in n.input]
    assert producer[site.input].op_type in ("Add", "Gemm")
    assert [n.op_type for n in consumers] == ["MatMul"]


def test_chained_gelus_get_stable_ids_in_graph_order(handmade):
    exact_then_tanh = helper.make_graph(
        [helper.make_node("Gelu", ["x"], ["h"], name="first"),
         helper.make_node("Gelu", ["h"], ["y"], name="second", approximate="tanh")],
        "two", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(exact_then_tanh, opset_imports=[helper.make_opsetid("", 20)])
    sites = find_gelu_sites(model)
    assert [(s.site_id, s.claimed, s.input, s.output) for s in sites] == [
        ("0:first", EXACT, "x", "h"), ("1:second", TANH, "h", "y")]
    assert find_gelu_sites(model) == sites


@pytest.mark.parametrize("kind", ["silu", "relu"])
def test_silu_and_relu_are_not_gelu_sites(torch_onnx, kind):
    assert find_gelu_sites(torch_onnx(kind, 17)) == []


def test_lone_erf_is_not_a_gelu_site(handmade):
    model = handmade.graph_model([helper.make_node("Erf", ["x"], ["e"]), helper.make_node("Add", ["e", "one"], ["y"])],
                                 [handmade.scalar("one", 1.0)])
    assert find_gelu_sites(model) == []


def test_relu_helper_lists_relu_nodes_as_relu_sites(torch_onnx):
    model = torch_onnx("relu", 17, mlp=True)
    [relu] = [n for n in model.graph.node if n.op_type == "Relu"]
    [site] = find_relu_sites(model)
    assert (site.op, site.claimed, site.nodes) == ("Relu", RELU, (relu.name,))
    assert (site.input, site.output) == (relu.input[0], relu.output[0])
    assert site.site_id == f"relu:0:{relu.name}"


@pytest.mark.parametrize(
    ("op_type", "attrs", "op", "claimed"),
    [("Gelu", {}, "com.microsoft.Gelu", EXACT),
     ("FastGelu", {}, "com.microsoft.FastGelu", TANH),
     ("QuickGelu", {}, "com.microsoft.QuickGelu", QUICK),
     ("QuickGelu", {"alpha": 1.6}, "com.microsoft.QuickGelu", UNKNOWN)],
)
def test_microsoft_ops_claim_their_kernel_flavour(handmade, op_type, attrs, op, claimed):
    [site] = find_gelu_sites(handmade.microsoft_op(op_type, **attrs))
    assert (site.op, site.claimed, site.input, site.output) == (op, claimed, "x", "y")


@pytest.mark.parametrize("op_type", ["FastGelu", "BiasGelu"])
def test_bias_taking_microsoft_ops_keep_the_activation_input(handmade, op_type):
    [site] = find_gelu_sites(handmade.microsoft_op(op_type, bias=np.ones(8)))
    assert site.input == "x"
    assert site.claimed == (TANH if op_type == "FastGelu" else EXACT)


def test_quick_gelu_with_alpha_one_is_silu_not_a_site(handmade):
    assert find_gelu_sites(handmade.microsoft_op("QuickGelu", alpha=1.0)) == []


@pytest.mark.parametrize("negate_with_node", [True, False])
def test_tf2onnx_erfc_form_is_an_exact_erf_chain(handmade, negate_with_node):
    [site] = find_gelu_sites(handmade.erfc_chain(negate_with_node))
    assert (site.op, site.claimed, site.input, site.output) == ("erf-chain", EXACT, "x", "y")
    assert "one_minus" in site.nodes and ("neg" in site.nodes) == negate_with_node


def test_tanh_chain_with_0_0447_typo_claims_unknown(handmade):
    [site] = find_gelu_sites(handmade.tanh_chain(0.0447))
    assert (site.op, site.claimed) == ("tanh-chain", UNKNOWN)
    assert "0.0447" in site.note and "0.044715" in site.note


def test_hand_built_tanh_chain_with_right_constant_claims_tanh(handmade):
    [site] = find_gelu_sites(handmade.tanh_chain(0.044715))
    assert (site.claimed, len(site.nodes)) == (TANH, 9)


def test_erf_chain_with_wrong_half_is_exact_at_another_scale(handmade):
    nodes = [helper.make_node("Div", ["x", "sqrt2"], ["a"]), helper.make_node("Erf", ["a"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["x", "p"], ["xp"]),
             helper.make_node("Mul", ["xp", "half"], ["y"])]
    model = handmade.graph_model(nodes, [handmade.scalar("sqrt2", math.sqrt(2)), handmade.scalar("one", 1.0),
                                         handmade.scalar("half", 0.6)])
    [site] = find_gelu_sites(model)
    assert (site.claimed, site.output) == (EXACT, "y") and site.scale == pytest.approx(1.2)
    assert "outer 0.6" in site.note


def test_float16_constants_are_judged_at_float16_precision(torch_onnx):
    model = convert_float_to_float16(torch_onnx("gelu_new", 17), keep_io_types=False)
    [site] = find_gelu_sites(model)
    assert site.claimed == TANH


# onnxruntime.transformers.optimizer on a Linear-GELU-Linear export (model_type "bert").
@pytest.mark.parametrize(
    ("kind", "opset", "opt_level", "approximate", "op", "claimed"),
    [
        # Add + Gelu(approximate='tanh') becomes BiasGelu, an exact kernel: a silent flavour change.
        ("nn_gelu_tanh", 20, 0, False, "com.microsoft.BiasGelu", EXACT),
        ("nn_gelu_none", 17, 0, False, "com.microsoft.BiasGelu", EXACT),
        ("nn_gelu_none", 17, 1, False, "com.microsoft.Gelu", EXACT),
        ("nn_gelu_tanh", 17, 0, False, "com.microsoft.FastGelu", TANH),
        # enable_gelu_approximation turns exact into FastGelu.
        ("nn_gelu_none", 17, 0, True, "com.microsoft.FastGelu", TANH),
        ("nn_gelu_none", 20, 1, True, "com.microsoft.FastGelu", TANH),
    ],
)
def test_sees_onnxruntime_optimizer_fusions(optimized, kind, opset, opt_level, approximate, op, claimed):
    [site] = find_gelu_sites(optimized(kind, opset, opt_level, approximate))
    assert (site.op, site.claimed) == (op, claimed)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_finds_exactly_the_mlp_gelus_of_a_tiny_gpt2(tmp_path):
    class ByKeyword(torch.nn.Module):  # transformers 5.x GPT2Model rejects positional export inputs
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            return self.model(input_ids=input_ids).last_hidden_state

    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100)
    path = tmp_path / "gpt2.onnx"
    torch.onnx.export(ByKeyword(transformers.GPT2Model(config)).eval(), (torch.randint(0, 100, (1, 6)),),
                      str(path), opset_version=17, dynamo=False)
    model = onnx.load(str(path))
    sites = find_gelu_sites(model)
    assert [(s.op, s.claimed) for s in sites] == [("tanh-chain", TANH)] * 2
    assert [s.site_id.split(":")[0] for s in sites] == ["0", "1"]
    # GPT-2's tanh GELU is its MLP activation, one per layer, and nothing else in it computes a
    # tanh: each site holds one Tanh node of the graph, each Tanh node is in one site, in graph order.
    op_type = {n.name: n.op_type for n in model.graph.node}
    tanh_nodes = [n.name for n in model.graph.node if n.op_type == "Tanh"]
    assert [[name for name in s.nodes if op_type[name] == "Tanh"] for s in sites] == [[t] for t in tanh_nodes]
