"""An ONNX file's graph read without its weights (load_structure), on a transformers BERT exported
both ways: weights inside the file (TorchScript exporter) and in external data (dynamo exporter)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from exporter import api
from exporter.frameworks import load_source
from exporter.sources import make_batches
from fixtures.models.hf_models import __file__ as HF_MODELS
from verifiers.errors import BadInput
from verifiers.formats import measured_sites
from verifiers.formats.onnx.gelu_normalize import split_duplicate_gemms
from verifiers.formats.onnx.gelu_sensitivity import swapped_variant
from verifiers.onnx_model import INLINE_WEIGHT_MIN_BYTES, load_structure

BERT = f"{HF_MODELS}:bert"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(path, report) of BERT exported with its weights inside (opset 17) and outside (opset 18)."""
    folder = tmp_path_factory.mktemp("bert")
    made = {}
    for layout, opset, exporter in (("inline", 17, "torchscript"), ("external", 18, "dynamo")):
        path = folder / layout / "bert.onnx"
        report = api.export(BERT, to="onnx", opset=opset, exporter=exporter, out=path)
        assert report.exit_code == 0, report.summary_lines()
        made[layout] = path, report
    return made


def test_weights_inside_the_file_are_marked_where_they_lie_and_not_read(exported):
    path, _ = exported["inline"]
    structure, full = load_structure(path), onnx.load(str(path))
    large = {t.name for t in full.graph.initializer if len(t.raw_data) > INLINE_WEIGHT_MIN_BYTES}
    assert large and structure.inline == large
    assert structure.external_data_files() == []  # the file itself is no companion
    assert [n.SerializeToString() for n in structure.model.graph.node] == [
        n.SerializeToString() for n in full.graph.node]
    marked = {t.name: t for t in structure.model.graph.initializer}
    assert all(not marked[name].raw_data and marked[name].data_location == onnx.TensorProto.EXTERNAL
               for name in large)
    # The marks are ONNX external data: onnx's own loader reads the very bytes back from the file.
    onnx.external_data_helper.load_external_data_for_model(structure.model, str(path.parent))
    for tensor in full.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(marked[tensor.name]), numpy_helper.to_array(tensor))


def test_external_data_stays_where_it_is(exported):
    path, _ = exported["external"]
    structure = load_structure(path)
    assert structure.inline == frozenset()
    assert structure.external_data_files() == ["bert.onnx.data"]


@pytest.mark.parametrize("layout", ["inline", "external"])
def test_the_gelu_swap_runs_on_the_artifacts_own_weights(exported, layout):
    """What the tolerance check reports equals the swapped model built from the fully loaded file."""
    path, report = exported[layout]
    sites = measured_sites("onnx", path)
    full = onnx.load(str(path))
    session = ort.InferenceSession(swapped_variant(split_duplicate_gemms(full), sites).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    source = load_source(BERT)
    feed = make_batches(source, report.seed, report.batches)[-1]
    reference = source.run(feed)[2][0]
    swapped = session.run(None, feed)[0]
    name = report.outputs[0].name
    assert report.gelu_swap_effect[name] == pytest.approx(float(np.abs(swapped - reference).max()), rel=1e-3)
    assert 0 < report.gelu_swap_effect[name] < 0.1


def test_two_initializers_of_one_name_are_refused(tmp_path):
    weight = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64])],
                              [weight, weight])
    onnx.save(helper.make_model(graph), str(tmp_path / "m.onnx"))
    with pytest.raises(BadInput, match="two initializers are named 'w'"):
        load_structure(tmp_path / "m.onnx")


def test_a_type_number_onnx_does_not_name_is_named_as_such():
    """A damaged file (the fuzz test's mutants) or one newer than this onnx may hold an element
    type onnx has no name for: every reader that names types (precision, target checks) gets one."""
    from verifiers.onnx_model import onnx_dtype_name

    assert 48 not in onnx.TensorProto.DataType.values()
    assert onnx_dtype_name(48) == "onnx type 48"
    assert onnx_dtype_name(onnx.TensorProto.FLOAT16) == "float16"
