"""GELU where the ONNX site finder must look beyond a flat graph of its own exporters' chains: the
ONNX spec's own function-body expansion of Gelu (generated with onnx's backend test-case
generator), an If branch and a local function. Each is found, measured, and verified against a
PyTorch source; a changed copy of each is exit 3."""

import functools
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from exporter import api
from fixtures.specs import torch_model
from verifiers.formats.onnx.gelu_inventory import onnx_inventory

# The ONNX spec's expanded Gelu cases; the generator computes every operator's cases, so it runs
# when a test first asks (in the worker that runs this module), not while every worker collects.
EXPANDED_NAMES = ["test_gelu_default_1_expanded", "test_gelu_default_2_expanded",
                  "test_gelu_tanh_1_expanded", "test_gelu_tanh_2_expanded"]


@functools.cache
def expanded() -> dict[str, onnx.ModelProto]:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # some operators' cases overflow
        from onnx.backend.test.case.node import collect_testcases

        return {case.name: case.model for case in collect_testcases("Gelu") if case.name.endswith("_expanded")}


SOURCES = {"exact": torch_model("bare_gelu_exact"), "tanh": torch_model("bare_gelu_tanh")}
OPSET = [helper.make_opsetid("", 20)]


def _flavour(name: str) -> str:
    return "tanh" if "tanh" in name else "exact"


def _measured(model: onnx.ModelProto) -> list[tuple[str, str]]:
    return [(entry.site.op, entry.measured) for entry in onnx_inventory(model) if entry.site.claimed != "relu"]


def test_the_generator_gives_the_expanded_gelu_models():
    assert sorted(expanded()) == EXPANDED_NAMES
    ops = {node.op_type for model in expanded().values() for node in model.graph.node}
    assert {"CastLike", "Constant", "Sqrt", "Sum"} <= ops


@pytest.mark.parametrize("name", EXPANDED_NAMES)
def test_expanded_function_body_is_found_measured_and_verified(tmp_path, name):
    model = expanded()[name]
    [(op, measured)] = _measured(model)
    assert measured == _flavour(name)
    path = tmp_path / "gelu.onnx"
    onnx.save(model, path)
    report = api.verify(path, source=SOURCES[_flavour(name)])
    assert report.exit_code == 0, report.summary_lines()
    assert [g["status"] for g in report.gelu] == ["kept"]


@pytest.mark.parametrize("name", EXPANDED_NAMES)
def test_expanded_function_body_against_the_other_flavour_is_exit_3(tmp_path, name):
    path = tmp_path / "gelu.onnx"
    onnx.save(expanded()[name], path)
    other = "exact" if _flavour(name) == "tanh" else "tanh"
    report = api.verify(path, source=SOURCES[other], atol=["1e-2"])
    assert report.outputs[0].passed  # the outputs alone would have shipped it
    assert report.exit_code == 3 and report.gelu[0]["status"] == "changed"


def _erf_chain(x: str, y: str, prefix: str, tanh: bool = False) -> tuple[list, list]:
    """0.5*x*(1+erf(x/sqrt2)) (or the tanh formula) as primitive nodes and their constants."""
    c = lambda name, v: helper.make_tensor(f"{prefix}{name}", TensorProto.FLOAT, [], [v])  # noqa: E731
    if tanh:
        consts = [c("cubic", 0.044715), c("scale", float(np.sqrt(2 / np.pi))), c("one", 1.0), c("half", 0.5)]
        nodes = [helper.make_node("Mul", [x, x], [f"{prefix}x2"]), helper.make_node("Mul", [f"{prefix}x2", x], [f"{prefix}x3"]),
                 helper.make_node("Mul", [f"{prefix}x3", f"{prefix}cubic"], [f"{prefix}cx3"]),
                 helper.make_node("Add", [x, f"{prefix}cx3"], [f"{prefix}inner"]),
                 helper.make_node("Mul", [f"{prefix}inner", f"{prefix}scale"], [f"{prefix}arg"]),
                 helper.make_node("Tanh", [f"{prefix}arg"], [f"{prefix}t"])]
        core = f"{prefix}t"
    else:
        consts = [c("root2", float(np.sqrt(2))), c("one", 1.0), c("half", 0.5)]
        nodes = [helper.make_node("Div", [x, f"{prefix}root2"], [f"{prefix}z"]),
                 helper.make_node("Erf", [f"{prefix}z"], [f"{prefix}e"])]
        core = f"{prefix}e"
    nodes += [helper.make_node("Add", [core, f"{prefix}one"], [f"{prefix}p"]),
              helper.make_node("Mul", [x, f"{prefix}p"], [f"{prefix}xp"]),
              helper.make_node("Mul", [f"{prefix}xp", f"{prefix}half"], [y])]
    return nodes, consts


def _if_model(tanh: bool) -> onnx.ModelProto:
    """y = If(max(x) > -inf) then GELU(x) else Relu(x): the GELU lives in the then branch."""
    gelu_nodes, consts = _erf_chain("x", "then_y", "then_", tanh)
    then_branch = helper.make_graph([helper.make_node("Constant", [], [t.name], value=t) for t in consts] + gelu_nodes,
                                    "then", [], [helper.make_tensor_value_info("then_y", TensorProto.FLOAT, None)])
    else_branch = helper.make_graph([helper.make_node("Relu", ["x"], ["else_y"])], "else", [],
                                    [helper.make_tensor_value_info("else_y", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
         helper.make_node("Greater", ["m", "low"], ["cond"]),
         helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch)],
        "if_gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor("low", TensorProto.FLOAT, [], [-np.inf])])
    return helper.make_model(graph, opset_imports=OPSET)


def _function_model(tanh: bool) -> onnx.ModelProto:
    """y = custom.MyGelu(x), a local function whose body is the primitive chain."""
    nodes, consts = _erf_chain("X", "Y", "", tanh)
    body = [helper.make_node("Constant", [], [t.name], value=t) for t in consts] + nodes
    function = helper.make_function("custom", "MyGelu", ["X"], ["Y"], body, OPSET)
    graph = helper.make_graph([helper.make_node("MyGelu", ["x"], ["y"], domain="custom")], "function_gelu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    return helper.make_model(graph, opset_imports=[*OPSET, helper.make_opsetid("custom", 1)], functions=[function])


@pytest.mark.parametrize("build", [_if_model, _function_model], ids=["if-branch", "local-function"])
def test_gelu_in_a_subgraph_or_function_is_found_and_measured(tmp_path, build):
    for tanh, flavour in ((False, "exact"), (True, "tanh")):
        model = build(tanh)
        onnx.checker.check_model(model, full_check=True)
        assert [measured for _, measured in _measured(model)] == [flavour]
        path = tmp_path / f"{flavour}.onnx"
        onnx.save(model, path)
        faithful = api.verify(path, source=SOURCES[flavour])
        assert faithful.exit_code == 0, faithful.summary_lines()
        changed = api.verify(path, source=SOURCES["tanh" if flavour == "exact" else "exact"])
        assert changed.exit_code == 3 and [g["status"] for g in changed.gelu] == ["changed"]
