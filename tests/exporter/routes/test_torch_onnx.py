"""PyTorch -> ONNX through the API: every requested opset honoured, artifacts verified in onnxruntime."""

import onnx
import onnxruntime as ort
import pytest

from exporter import api
from fixtures.specs import torch_model
from verifiers.onnx_model import default_opset


# 17 (TorchScript) and 20 (dynamo, fused Gelu) by default; the opsets between are the slow suite's.
@pytest.mark.parametrize("opset", [pytest.param(13, marks=pytest.mark.slow), 17,
                                   pytest.param(18, marks=pytest.mark.slow), 20])
@pytest.mark.parametrize("model", ["mlp_exact", "mlp_tanh", "block_exact", "block_tanh"])
def test_export_at_requested_opset_and_verify(tmp_path, model, opset):
    out = tmp_path / "dist" / f"{model}.onnx"
    report = api.export(torch_model(model), to="onnx", opset=opset, out=out)

    assert report.exit_code == 0, report.summary_lines()
    assert report.actual_opset == opset
    assert default_opset(onnx.load(str(out), load_external_data=False)) == opset
    assert report.outputs and all(o.passed for o in report.outputs)
    assert report.outputs[0].max_abs_err < 1e-5
    # Staging leaves nothing behind: only the artifact and its external data.
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(
        [out.name] + [d["path"].rsplit("/", 1)[-1] for d in report.artifact.data_files])


def test_auto_prefers_torchscript_below_18_and_dynamo_from_18(tmp_path):
    low = api.export(torch_model("mlp_exact"), to="onnx", opset=13, out=tmp_path / "a.onnx")
    high = api.export(torch_model("mlp_exact"), to="onnx", opset=18, out=tmp_path / "b.onnx")
    assert low.exporter == "torch.onnx (torchscript)"
    assert high.exporter == "torch.onnx (dynamo)"


def test_forced_exporter_that_cannot_honour_the_opset_is_exit_4(tmp_path):
    out = tmp_path / "m.onnx"
    report = api.export(torch_model("block_exact"), to="onnx", opset=13, exporter="dynamo", out=out)
    assert report.exit_code == 4
    assert [f.kind for f in report.failures] == ["opset"]
    assert "asked for opset 13" in report.failures[0].message and "produced opset 18" in report.failures[0].message
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_torchscript_above_its_last_opset_is_exit_4(tmp_path):
    report = api.export(torch_model("mlp_exact"), to="onnx", opset=21, exporter="torchscript",
                        out=tmp_path / "m.onnx")
    assert report.exit_code == 4
    assert "stops at opset 20" in report.failures[0].message


def test_external_data_travels_with_the_artifact(tmp_path):
    out = tmp_path / "release" / "block.onnx"
    report = api.export(torch_model("block_exact"), to="onnx", opset=18, out=out)
    assert report.exit_code == 0
    data = out.parent / "block.onnx.data"
    assert [d["path"] for d in report.artifact.data_files] == [str(data)]
    assert data.stat().st_size > 10_000
    # It loads from its final place.
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])


def test_inputs_by_keyword_integer_ranges_and_named_outputs(tmp_path):
    report = api.export(torch_model("keyword_inputs"), to="onnx", opset=17, out=tmp_path / "k.onnx",
                        inputs=["input_ids:2x5:int64:0..100"])
    assert report.exit_code == 0, report.summary_lines()
    assert [o.name for o in report.outputs] == ["logits"]
    assert report.outputs[0].artifact_name == "logits"


def test_dynamic_axis(tmp_path):
    out = tmp_path / "d.onnx"
    report = api.export(torch_model("mlp_exact"), to="onnx", opset=17, out=out, dynamic=["input:0"],
                        inputs=[])
    assert report.exit_code == 0, report.summary_lines()
    shape = onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim
    assert shape[0].dim_param and shape[1].dim_value == 16


@pytest.mark.parametrize(("opset", "size", "parts", "sizes"), [
    (17, 8, 3, [3, 3, 2]), (17, 8, 2, [4, 4]), (11, 7, 3, [3, 3, 1]), (13, 6, 3, [2, 2, 2])])
def test_split_num_outputs_is_rewritten_for_the_lower_opset(opset, size, parts, sizes):
    import numpy as np
    from onnx import TensorProto, helper

    from exporter.routes.torch_onnx import split_sizes_for_opset

    outputs = [f"y{i}" for i in range(parts)]
    graph = helper.make_graph(
        [helper.make_node("Split", ["x"], outputs, axis=1, num_outputs=parts)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, size])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, None]) for name in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    with pytest.raises(onnx.checker.ValidationError, match="num_outputs"):
        onnx.checker.check_model(model, full_check=True)

    assert split_sizes_for_opset(model) == 1
    onnx.checker.check_model(model, full_check=True)
    x = np.arange(2 * size, dtype=np.float32).reshape(2, size)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert [g.shape[1] for g in got] == sizes
    np.testing.assert_array_equal(np.concatenate(got, axis=1), x)


def test_a_released_source_leaves_memory_after_the_export(tmp_path):
    """The weights of an exported, released source are freed before the artifact's runtime loads
    beside them: nothing the exporter leaves behind (onnxscript's rewrite rules keep the last graph
    they optimized) holds them, and a transformers model's reference cycles are collected, when
    the collector has set aside every object alive before the export (gc.freeze, as a second
    source loaded in one process finds it), the rules and their matchers among them."""
    import gc
    import weakref

    import onnxscript.optimizer
    import onnxscript.rewriter  # noqa: F401 - the rules, alive before the export like any module's objects

    from exporter.frameworks import load_source
    from exporter.routes import ExportRequest, route_for
    from fixtures.models.hf_folders import save_folder

    folder = save_folder("llama-causal-lm", tmp_path / "llama")
    gc.freeze()
    try:
        source = load_source(str(folder))
        weight = weakref.ref(source.model.model.lm_head.weight)
        request = ExportRequest("onnx", opset=18, exporter="dynamo", dynamic=source.dynamic,
                                sample_inputs=source.example)
        route_for("torch", "onnx", "dynamo").export(source, request, tmp_path / "llama.onnx", lambda message: None)
        source.release()
        assert weight() is None
    finally:
        gc.unfreeze()
