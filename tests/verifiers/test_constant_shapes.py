"""Constant shapes in an ONNX graph (verifiers.onnx_model.constant_shapes): a Reshape to a constant
[2, -1] holds the batch it was exported at, a Reshape to a Shape node's output does not; the
hint a run at other sizes gets from them (verifiers.judging.baked_size_hints). Models are built
here with onnx.helper and run in onnxruntime, so they are models a runtime takes."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from verifiers.formats import detect_format
from verifiers.onnx_model import constant_shapes
from verifiers.judging import baked_size_hints
from verifiers.report import Report
from verifiers.sizes import DynamicAxis, plan_sizes


def _model() -> onnx.ModelProto:
    """x [batch, 3, 4] -> `baked` (Reshape to the constant [2, -1]), `expanded` (Reshape to
    Shape(x), then Expand to a Constant node's [1, 1, 4]) and `sliced` (Slice of the last axis
    with constant starts [0] and ends [-1]; its axes input is not a size and is not read)."""
    nodes = [
        helper.make_node("Reshape", ["x", "baked_shape"], ["baked"], name="/flatten/Reshape"),
        helper.make_node("Shape", ["x"], ["x_shape"], name="/shape/Shape"),
        helper.make_node("Reshape", ["x", "x_shape"], ["follows"], name="/keep/Reshape"),
        helper.make_node("Constant", [], ["expand_shape"], value=numpy_helper.from_array(
            np.array([1, 1, 4], np.int64), "expand_shape_value")),
        helper.make_node("Expand", ["follows", "expand_shape"], ["expanded"]),  # unnamed: labelled by its output
        helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["sliced"], name="/slice/Slice"),
    ]
    initializers = [numpy_helper.from_array(np.array([2, -1], np.int64), "baked_shape"),
                    numpy_helper.from_array(np.array([0], np.int64), "starts"),
                    numpy_helper.from_array(np.array([-1], np.int64), "ends"),
                    numpy_helper.from_array(np.array([2], np.int64), "axes")]
    graph = helper.make_graph(
        nodes, "shapes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [None] * rank)
         for name, rank in (("baked", 2), ("expanded", 3), ("sliced", 3))],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def test_only_constant_shapes_are_listed():
    found = constant_shapes(_model())
    assert found == [("/flatten/Reshape", "Reshape", [2, -1]),
                     ("expanded", "Expand", [1, 1, 4]),
                     ("/slice/Slice", "Slice", [0]), ("/slice/Slice", "Slice", [-1])]
    assert not any(node == "/keep/Reshape" for node, _, _ in found)  # its shape comes from a Shape node


def test_a_reshape_to_a_computed_shape_is_not_listed_and_a_float_constant_is_not_a_shape():
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["y"], name="r"),
         helper.make_node("Tile", ["y", "reps"], ["z"], name="t")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "reps")])
    assert constant_shapes(helper.make_model(graph)) == []


def test_the_model_built_runs_and_the_constant_shape_holds_the_export_batch(tmp_path):
    model = _model()
    path = tmp_path / "shapes.onnx"
    onnx.save(model, str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x2 = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    baked, expanded, sliced = session.run(None, {"x": x2})
    assert baked.shape == (2, 12) and expanded.shape == (2, 3, 4) and sliced.shape == (2, 3, 3)
    # at batch 4 the constant [2, -1] still makes 2 rows: the baked batch the hint is about
    baked4, _, _ = session.run(None, {"x": np.zeros((4, 3, 4), np.float32)})
    assert baked4.shape == (2, 24)

    artifact = detect_format(path).open(path)
    assert artifact.shape_constants() == constant_shapes(model)
    report = Report(command="verify")
    plans = plan_sizes([DynamicAxis("x", 0, "batch")], {"x": x2})
    baked_size_hints(report, artifact, plans)
    [hint] = report.dynamic_hints
    assert hint["kind"] == "constant_shape" and hint["location"] == "/flatten/Reshape"
    assert "[2, -1]" in hint["message"] and "holds 2" in hint["message"] and "x axis 0" in hint["message"]

    # exported at batch 3 nothing holds it; at 1 nothing is hinted (1 is in every shape)
    for size in (3, 1):
        report = Report(command="verify")
        baked_size_hints(report, artifact, plan_sizes([DynamicAxis("x", 0, "batch")],
                                                      {"x": np.zeros((size, 3, 4), np.float32)}))
        assert report.dynamic_hints == []
