"""The graph-neutral chain algebra on hand-built neutral graphs."""

import math

import ml_dtypes
import numpy as np
import pytest

from verifiers.gelu import EXACT, QUICK, RELU, TANH, UNKNOWN
from verifiers.gelu.catalogue import SILU
from verifiers.gelu.chain_graph import ChainGraph, Match, OpNode
from verifiers.gelu.chains import find_relu_sites, find_silu_sites, find_sites


def node(name, op, inputs, output=None, **attrs):
    return OpNode(name, op, tuple(inputs), (output or name,), attrs)


def graph(nodes, output, **constants):
    return ChainGraph(nodes, {k: np.asarray(v) for k, v in constants.items()}, [output])


def erfc_gelu(half=0.5):
    """0.5*x*erfc(-x/sqrt2) as TF writes it, Erfc expanded into Erf and Sub under one name."""
    nodes = [
        node("mul", "Mul", ["c_half", "x"]),
        node("neg", "Neg", ["x"]),
        node("mul_1", "Mul", ["neg", "c_scale"]),
        node("erfc", "Erf", ["mul_1"], "erfc#erf"),
        node("erfc", "Sub", ["erfc#one", "erfc#erf"]),
        node("mul_2", "Mul", ["mul", "erfc"]),
    ]
    return graph(nodes, "mul_2", c_half=np.float32(half), c_scale=np.float32(1 / math.sqrt(2)),
                 **{"erfc#one": np.float32(1.0)})


def test_erfc_expansion_is_one_exact_site_listing_the_source_node_once():
    [site] = find_sites(erfc_gelu())
    assert (site.site_id, site.op, site.claimed) == ("0:mul", "erf-chain", EXACT)
    assert site.nodes == ("mul", "neg", "mul_1", "erfc", "mul_2")
    assert (site.input, site.output) == ("x", "mul_2")


def test_wrong_outer_constant_is_the_flavour_at_another_scale():
    # 0.6 x (1 - erf(-x/sqrt2)) is 1.2 x exact GELU: the numbers claim the flavour and its scale.
    [site] = find_sites(erfc_gelu(half=0.6))
    assert site.claimed == EXACT and site.scale == pytest.approx(1.2)
    assert "outer 0.6" in site.note and "1.2 x exact" in site.note


@pytest.mark.parametrize(("approximate", "claimed"), [("none", EXACT), ("tanh", TANH), ("fast", UNKNOWN)])
def test_gelu_node_claims_its_approximate_attribute(approximate, claimed):
    [site] = find_sites(graph([node("g", "Gelu", ["x"], approximate=approximate)], "g"))
    assert (site.op, site.claimed, site.note) == ("Gelu", claimed, f"approximate='{approximate}'")


def test_cube_by_multiplication_and_float16_constants():
    nodes = [
        node("half_x", "Mul", ["x", "half"]),
        node("x2", "Mul", ["x", "x"]),
        node("x3", "Mul", ["x2", "x"]),
        node("cx3", "Mul", ["x3", "cubic"]),
        node("inner", "Add", ["cx3", "x"]),
        node("arg", "Mul", ["inner", "scale"]),
        node("t", "Tanh", ["arg"]),
        node("p", "Add", ["t", "one"]),
        node("y", "Mul", ["half_x", "p"]),
    ]
    f16 = np.float16
    g = graph(nodes, "y", half=f16(0.5), cubic=f16(0.044715), scale=f16(math.sqrt(2 / math.pi)), one=f16(1))
    [site] = find_sites(g)
    assert (site.op, site.claimed, len(site.nodes)) == ("tanh-chain", TANH, 9)


@pytest.mark.parametrize(("dtype", "claimed"), [(ml_dtypes.bfloat16, TANH), (np.float32, UNKNOWN)])
def test_constants_are_judged_at_their_stored_precision(dtype, claimed):
    """sqrt(2/pi) rounded to bfloat16 (0.796875) is right for a bfloat16 model, off for float32."""
    nodes = [node("p3", "Pow", ["x", "three"]), node("cx3", "Mul", ["p3", "cubic"]),
             node("inner", "Add", ["x", "cx3"]), node("arg", "Mul", ["inner", "scale"]),
             node("t", "Tanh", ["arg"]), node("p", "Add", ["t", "one"]),
             node("hx", "Mul", ["x", "half"]), node("y", "Mul", ["hx", "p"])]
    values = {"three": 3.0, "cubic": 0.044715, "scale": 0.796875, "one": 1.0, "half": 0.5}
    [site] = find_sites(graph(nodes, "y", **{k: np.asarray(v, dtype) for k, v in values.items()}))
    assert site.claimed == claimed


@pytest.mark.parametrize(("alpha", "claimed"), [(1.702, QUICK), (1.6, UNKNOWN), (1.0, SILU), (8.0, None)])
def test_sigmoid_chain_is_quick_unknown_silu_or_no_site(alpha, claimed):
    nodes = [node("ax", "Mul", ["alpha", "x"]), node("s", "Sigmoid", ["ax"]), node("y", "Mul", ["x", "s"])]
    g = graph(nodes, "y", alpha=np.float64(alpha))
    found = find_sites(g) + find_silu_sites(g)
    assert [s.claimed for s in found] == ([claimed] if claimed else [])


def test_a_chain_does_not_run_through_a_tensor_used_elsewhere():
    nodes = [node("e", "Erf", ["x"]), node("p", "Add", ["e", "one"]), node("y", "Mul", ["x", "p"]),
             node("z", "Mul", ["y", "half"]), node("other", "MatMul", ["y", "w"])]
    [site] = find_sites(graph(nodes, "z", one=np.float32(1), half=np.float32(0.5)))
    assert (site.claimed, site.output) == (UNKNOWN, "y")  # stops before the shared tensor: no 0.5


def test_fused_hook_sees_the_nodes_no_shared_matcher_handles():
    seen = []

    def fused(g, i):
        seen.append(g.nodes[i].op)
        if g.nodes[i].op != "my.QuickGelu":
            return None
        return Match("my.QuickGelu", QUICK, frozenset({i}), g.nodes[i].inputs[0], g.nodes[i].outputs[0], "")

    g = graph([node("g", "Gelu", ["x"]), node("c", "my.QuickGelu", ["g"]), node("r", "Relu", ["c"])], "r")
    assert [(s.op, s.claimed) for s in find_sites(g, fused)] == [("Gelu", EXACT), ("my.QuickGelu", QUICK)]
    assert seen == ["my.QuickGelu", "Relu"]
    assert [(s.site_id, s.op, s.claimed) for s in find_relu_sites(g, "RELU")] == [("relu:0:r", "RELU", RELU)]
