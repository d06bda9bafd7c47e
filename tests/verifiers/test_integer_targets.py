"""Integer devices in the matrix (edgetpu-16.0, tflite-2.9-hexagon, ort-1.18-qnn-htp): their facts
validate, and real conversions are checked against them (precision, dynamic axes, ranks, op lists),
once through the CLI."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import yaml

from tests.verifiers.test_precision import onnx_convnet, tflite_mlp  # noqa: F401 - fixtures
from verifiers.errors import BadInput
from verifiers.report import Report
from verifiers.target_check import check_artifact, to_findings
from verifiers.target_matrix import load_targets

INTEGER_DEVICES = ("edgetpu-16.0", "tflite-2.9-hexagon")


@pytest.fixture(scope="module")
def targets():
    return load_targets()


def by_kind(found, kind: str):
    return [i for i in found if i.kind == kind]


# ---- the matrix ------------------------------------------------------------------------------------


def test_integer_device_facts_are_sourced(targets):
    tpu, hexagon, qnn = targets["edgetpu-16.0"], targets["tflite-2.9-hexagon"], targets["ort-1.18-qnn-htp"]
    assert tpu.integer_only and tpu.integer_dtypes == ("int8", "uint8") and tpu.static_shapes
    assert tpu.max_inner_dims == 3 and tpu.ops is None
    assert hexagon.integer_only and hexagon.max_rank == 4 and {"FULLY_CONNECTED", "CONV_2D"} <= set(hexagon.ops)
    assert qnn.format == "onnx" and qnn.integer_only and {"uint16", "int16"} <= set(qnn.integer_dtypes)
    assert qnn.static_shapes and {g.op for g in qnn.op_gaps} == {"Loop", "If"}
    for target in (tpu, hexagon, qnn):
        assert {"integer_only"} <= target.fact_keys() <= {s.fact for s in target.sources}


BASE_ENTRY = {
    "format": "tflite", "runtime": "npu", "version": "1.0", "max_runtime_version": None,
    "gelu": {"builtin": None, "builtin_int8": None, "tanh_chain": None, "sign_op": None},
    "sources": [{"fact": "integer_only", "source": "vendor notes", "quote": "int8 only"}],
    "integer_only": True, "integer_dtypes": ["int8"],
}


@pytest.mark.parametrize("change, field, problem", [
    ({"integer_dtypes": []}, "integer_dtypes", "is required with integer_only: true"),
    ({"integer_dtypes": ["int4"]}, "integer_dtypes", "must list only"),
    ({"integer_only": False}, "integer_dtypes", "is only for integer_only: true"),
    ({"integer_only": "yes"}, "integer_only", "must be true, false or null"),
    ({"max_rank": 0}, "max_rank", "must be a positive integer"),
    ({"ops": []}, "ops", "must list at least one op"),
    ({"static_shapes": True}, "static_shapes", "has no entry in 'sources'"),
    ({"format": "onnx", "max_opset": 17, "gelu": {"gelu_op": None, "erf": None, "contrib_gelu": None},
      "max_inner_dims": 3}, "max_inner_dims", "is not a field of onnx targets"),
])
def test_malformed_integer_facts_name_the_field(tmp_path, change, field, problem):
    entry = copy.deepcopy(BASE_ENTRY) | change
    if entry["format"] == "onnx":
        del entry["max_runtime_version"]
    path = tmp_path / "npu.yaml"
    path.write_text(yaml.safe_dump({"schema": 1, "targets": {"npu-1.0": entry}}), encoding="utf-8")
    with pytest.raises(BadInput) as err:
        load_targets(path)
    assert f"field '{field}' {problem}" in str(err.value)


# ---- TFLite ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", INTEGER_DEVICES)
def test_float_mlp_fails_integer_devices_naming_its_first_op(tflite_mlp, targets, target):
    found = check_artifact(tflite_mlp("float"), targets[target])
    (precision,) = by_kind(found, "precision")
    first = precision.detail["first_float_op"]
    assert precision.detail["mode"] == "float" and first["op"] == "FULLY_CONNECTED" and first["dtype"] == "float32"
    assert len(precision.detail["float_ops"]) == 3 and precision.detail["fact"] == "integer_only"
    assert precision.message.startswith("float32 model (mode float): FULLY_CONNECTED at node ")
    assert f"computes on float32 tensor {first['tensor']}, first of 3 float ops" in precision.message
    assert "integer_only: true; source: " in precision.message and "\n" not in precision.message
    report = Report(command="check")
    report.failures.extend(to_findings(found, targets[target]))
    assert report.exit_code == 4


@pytest.mark.parametrize("name, mode", [("dynamic", "dynamic-int8"), ("fp16", "fp16")])
@pytest.mark.parametrize("target", INTEGER_DEVICES)
def test_weight_only_quantization_still_fails(tflite_mlp, targets, target, name, mode):
    (precision,) = by_kind(check_artifact(tflite_mlp(name), targets[target]), "precision")
    assert precision.detail["mode"] == mode and f"(mode {mode})" in precision.message
    assert precision.detail["first_float_op"]["op"] == "FULLY_CONNECTED"


@pytest.mark.parametrize("name", ["int8", "int8_float_io"])
def test_full_integer_mlp_passes_the_edge_tpu(tflite_mlp, targets, name):
    assert check_artifact(tflite_mlp(name), targets["edgetpu-16.0"]) == []


def test_full_integer_mlp_passes_hexagon_and_its_float_output_boundary_does_not(tflite_mlp, targets):
    hexagon = targets["tflite-2.9-hexagon"]
    assert check_artifact(tflite_mlp("int8"), hexagon) == []
    (op,) = check_artifact(tflite_mlp("int8_float_io"), hexagon)  # the DEQUANTIZE to the float output
    assert op.kind == "op" and op.detail["op"] == "DEQUANTIZE" and op.detail["fact"] == "ops"
    assert "tflite-2.9-hexagon runs only the ops it lists" in op.message


def test_dynamic_batch_is_a_shape_incompatibility(tflite_mlp, targets):
    (shape,) = check_artifact(tflite_mlp("int8_dynamic_batch"), targets["edgetpu-16.0"])
    ((axis,), fact) = shape.detail["axes"], shape.detail["fact"]
    assert shape.kind == "shape" and axis["axis"] == 0 and fact == "static_shapes"
    assert f"input {axis['input']} axis 0 is dynamic" in shape.message
    assert "static_shapes: true" in shape.message
    assert check_artifact(tflite_mlp("int8_dynamic_batch"), targets["tflite-2.9-hexagon"]) == []  # no claim


def test_rank_rules(tflite_mlp, targets, tmp_path):
    """A user target with the Edge TPU's rule at one inner dimension and a rank limit of 1: the
    MLP's [1, 32] input keeps to the first and breaks the second."""
    entry = copy.deepcopy(BASE_ENTRY) | {"integer_only": None, "integer_dtypes": [], "max_rank": 1,
                                         "max_inner_dims": 1}
    entry["sources"] = [{"fact": f, "source": "notes", "quote": "q"} for f in ("max_rank", "max_inner_dims")]
    path = tmp_path / "npu.yaml"
    path.write_text(yaml.safe_dump({"schema": 1, "targets": {"npu-1.0": entry}}), encoding="utf-8")
    found = check_artifact(tflite_mlp("int8"), load_targets(path)["npu-1.0"])
    assert [(i.kind, i.detail["fact"]) for i in found] == [("shape", "max_rank")]
    assert "activation tensors with more than 1 dimensions" in found[0].message


@pytest.mark.slow
def test_mobilenet_v2_full_int8_passes_the_edge_tpu(tmp_path, targets):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(alpha=0.35, weights=None, input_shape=(96, 96, 3))
    inputs = keras.Input((96, 96, 3), batch_size=1)
    fixed = keras.Model(inputs, model(inputs))
    rng = np.random.default_rng(0)
    converter = tf.lite.TFLiteConverter.from_keras_model(fixed)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([rng.random((1, 96, 96, 3), dtype=np.float32)] for _ in range(4))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = converter.inference_output_type = tf.int8
    path = tmp_path / "mobilenet_v2.tflite"
    path.write_bytes(converter.convert())
    assert check_artifact(path, targets["edgetpu-16.0"]) == []


# ---- ONNX ------------------------------------------------------------------------------------------


def test_qdq_model_passes_qnn_htp_and_the_float_one_fails(onnx_convnet, targets):
    qnn = targets["ort-1.18-qnn-htp"]
    assert check_artifact(onnx_convnet("qdq"), qnn) == []
    (precision,) = check_artifact(onnx_convnet("float"), qnn)
    assert precision.kind == "precision" and precision.detail["mode"] == "float"
    assert precision.message.startswith("float32 model (mode float): Conv at node conv computes on float32 tensor x")
    assert "QNN HTP backend only supports quantized models" in precision.message


def test_op_type_left_out_of_quantization_is_named(onnx_convnet, targets):
    (precision,) = check_artifact(onnx_convnet("qdq_no_matmul"), targets["ort-1.18-qnn-htp"])
    assert precision.kind == "precision" and precision.detail["first_float_op"]["op"] == "MatMul"
    assert "MatMul at node fc computes on float32 tensor fc_w, first of 1 float op;" in precision.message


def test_qnn_htp_flags_dynamic_axes_and_loops(tmp_path, targets):
    import onnx
    from onnx import TensorProto, helper

    body = helper.make_graph([helper.make_node("Identity", ["x"], ["body_y"])], "body", [],
                             [helper.make_tensor_value_info("body_y", TensorProto.INT8, ["n"])])
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], then_branch=body, else_branch=body, name="branch")], "g",
        [helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.INT8, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, ["n"])])
    path = tmp_path / "branch.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    found = check_artifact(path, targets["ort-1.18-qnn-htp"])
    assert sorted(i.kind for i in found) == ["op", "shape"]
    shape = next(i for i in found if i.kind == "shape")
    assert (shape.detail["axes"], shape.detail["fact"]) == ([{"input": "x", "axis": 0}], "static_shapes")
    assert "If at 1 node (branch)" in next(i.message for i in found if i.kind == "op")


def test_every_dynamic_axis_is_one_line_with_the_export_that_fixes_it(tmp_path, targets):
    import onnx
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info(name, TensorProto.INT8, ["batch", "length"]) for name in ("ids", "mask")]
    graph = helper.make_graph([helper.make_node("Add", ["ids", "mask"], ["y"])], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.INT8, ["batch", "length"])])
    path = tmp_path / "dynamic.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    target = targets["ort-1.18-qnn-htp"]
    (shape,) = [i for i in check_artifact(path, target) if i.kind == "shape"]
    assert shape.detail["axes"] == [{"input": "ids", "axis": 0}, {"input": "ids", "axis": 1},
                                    {"input": "mask", "axis": 0}, {"input": "mask", "axis": 1}]
    assert shape.message.startswith("inputs ids (axes 0, 1), mask (axes 0, 1) are dynamic;")
    (finding,) = to_findings([shape], target)
    assert finding.message.endswith("; exportgate export MODEL --to onnx --target ort-1.18-qnn-htp writes one it takes")


# ---- the CLI ---------------------------------------------------------------------------------------


def test_check_cli_exits_4_on_the_float_mlp_and_0_on_the_int8_one(tflite_mlp, cli):
    failed = cli("check", tflite_mlp("float"), "--target", "edgetpu-16.0")
    assert failed.returncode == 4, failed.stdout + failed.stderr
    assert "mode float" in failed.stdout + failed.stderr
    passed = cli("check", tflite_mlp("int8"), "--target", "edgetpu-16.0")
    assert passed.returncode == 0, passed.stdout + passed.stderr
