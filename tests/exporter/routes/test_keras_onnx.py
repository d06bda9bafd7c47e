"""Keras 3 -> ONNX through tf2onnx: every GELU spelling, Sequential and functional, opsets 13-20."""

import onnx
import pytest

from exporter import api
from fixtures.specs import keras_model
from verifiers.onnx_model import iter_nodes

SPELLINGS = ["activation", "approximate", "ops"]


# 17 and 20 by default; 13 and 18 (tf2onnx's other handler versions) are the slow suite's.
@pytest.mark.parametrize("opset", [pytest.param(13, marks=pytest.mark.slow), 17,
                                   pytest.param(18, marks=pytest.mark.slow), 20])
@pytest.mark.parametrize("kind", ["sequential", "functional"])
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_export_and_verify(tmp_path, kind, spelling, opset):
    out = tmp_path / "m.onnx"
    report = api.export(keras_model(f"{kind}_{spelling}"), to="onnx", opset=opset, out=out)

    assert report.exit_code == 0, report.summary_lines()
    assert report.actual_opset == opset
    assert report.outputs[0].max_abs_err < 1e-5
    ops = {n.op_type for n in iter_nodes(onnx.load(str(out)).graph)}
    assert "Erfc" not in ops
    if spelling == "activation":  # exact GELU survives as Erf (Erfc lowered to 1 - Erf)
        assert "Erf" in ops
    else:
        assert "Tanh" in ops
    if opset >= 18:  # converted at 17 (tf2onnx's opset-18 conversion misplaces ReduceMean axes)
        assert any("version_converter" in note for note in report.notes)


def test_functional_outputs_match_by_name(tmp_path):
    report = api.export(keras_model("functional_activation"), to="onnx", opset=17, out=tmp_path / "m.onnx")
    assert report.outputs[0].name == "logits" and report.outputs[0].artifact_name == "logits"


def test_unbuilt_sequential_takes_its_inputs_from_the_example(tmp_path):
    report = api.export(keras_model("sequential_unbuilt"), to="onnx", opset=17, out=tmp_path / "m.onnx")
    assert report.exit_code == 0, report.summary_lines()
    assert report.example_batch


def test_a_keras_file_exports(tmp_path):
    """A .keras file without code in it loads without --trust-source (one with a Lambda layer does
    not: tests/cli/test_hostile_files.py)."""
    import fixtures.models.keras_models as models

    path = tmp_path / "m.keras"
    models.functional_activation().save(path)
    report = api.export(str(path), to="onnx", opset=18, out=tmp_path / "m.onnx")
    assert report.exit_code == 0, report.summary_lines()


def test_opset_below_tf2onnx_range_is_exit_4(tmp_path):
    report = api.export(keras_model("functional_activation"), to="onnx", opset=6, out=tmp_path / "m.onnx")
    assert report.exit_code == 4
    assert report.failures[0].kind == "opset"


@pytest.mark.parametrize("opset", [17, 20])
def test_a_captured_tensor_is_frozen_not_left_as_a_graph_input(tmp_path, opset):
    # tf2onnx's from_function makes a captured non-variable tensor a second graph input.
    out = tmp_path / "m.onnx"
    report = api.export(keras_model("captured_constant"), to="onnx", opset=opset, out=out)
    assert report.exit_code == 0, report.summary_lines()
    graph = onnx.load(str(out)).graph
    assert [i.name for i in graph.input] == ["features"]
    assert [o.name for o in graph.output] == ["logits"]
    assert [g["status"] for g in report.gelu] == ["kept"]


@pytest.mark.slow
def test_weights_past_2gib_export_into_external_data(tmp_path):
    # Frozen, 2.4 GB of weights make a GraphDef protobuf cannot hold ("Invalid GraphDef").
    out = tmp_path / "m.onnx"
    report = api.export(keras_model("over_2gb"), to="onnx", opset=17, out=out)

    assert report.exit_code == 0, report.summary_lines()
    assert any("exceed protobuf's 2 GiB" in note for note in report.notes)
    data = out.parent / f"{out.name}.data"
    assert data.stat().st_size > 2**31 and out.stat().st_size < 2**20
    model = onnx.load(str(out), load_external_data=False)
    assert [i.name for i in model.graph.input] == ["x"]  # the weights are initializers, not inputs
    assert [g["status"] for g in report.gelu] == ["kept"] * 3
