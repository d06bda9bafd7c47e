"""The GELU guard on what real models do: dead code, sources it cannot capture, dict inputs in any
order, BatchNorm on a batch of one, and a converter that folds GELU's 0.5 into the next layer."""

import pytest

from exporter import api
from exporter.routes import ExportRequest, route_for
from exporter.frameworks import load_source
from exporter.sources import make_batches
from fixtures.specs import keras_model, torch_model

ROUTES = [("onnx", 17), ("onnx", 20), ("tflite", None)]
IDS = ["onnx17", "onnx20", "tflite"]


def _statuses(report):
    return [(g["status"], g["source_flavour"]) for g in report.gelu]


@pytest.mark.parametrize(("to", "opset"), ROUTES, ids=IDS)
def test_a_gelu_no_output_depends_on_is_listed_unused_not_gone(tmp_path, to, opset):
    # The exporters drop the dead head; the source graph still holds it.
    report = api.export(torch_model("dead_head"), to=to, opset=opset, out=tmp_path / f"m.{to}")
    assert report.exit_code == 0, report.summary_lines()
    assert _statuses(report) == [("kept", "exact"), ("unused", "exact")]
    unused = report.gelu[1]
    assert unused["source_site"] and "reaches no output" in unused["message"]
    assert any("1 unused" in line for line in report.summary_lines())


def test_a_data_dependent_branch_is_read_where_the_sample_takes_it(tmp_path):
    # torch.export cannot capture the branch; the recorded run reads the GELU the sample reaches.
    report = api.export(torch_model("always_taken_branch"), to="onnx", opset=17, out=tmp_path / "m.onnx")
    assert report.exit_code == 0, report.summary_lines()
    assert report.gelu_guard == "checked" and _statuses(report) == [("kept", "exact")]


def test_a_source_graph_that_cannot_be_read_fails_unless_the_guard_is_off(tmp_path):
    guarded = api.export(torch_model("refuses_dispatch_modes"), to="onnx", opset=17, out=tmp_path / "m.onnx")
    assert guarded.exit_code == 3 and [f.kind for f in guarded.failures] == ["gelu_guard"]
    assert "could not read the source graph" in guarded.failures[0].message
    assert "--no-gelu-guard" in guarded.failures[0].message
    assert not (tmp_path / "m.onnx").exists()

    off = api.export(torch_model("refuses_dispatch_modes"), to="onnx", opset=17, out=tmp_path / "m.onnx",
                     gelu_guard=False)
    assert off.exit_code == 0 and off.gelu_guard == "off (--no-gelu-guard)"
    assert off.to_dict()["gelu_guard"] == "off (--no-gelu-guard)"
    assert any("GELU guard off" in line for line in off.summary_lines())


def test_no_gelu_guard_is_a_cli_option_on_export_and_verify(cli, tmp_path):
    export = cli("export", torch_model("refuses_dispatch_modes"), "--to", "onnx", "--opset", "17",
                 "--out", "m.onnx", "--no-gelu-guard")
    assert export.returncode == 0, export.stderr
    verify = cli("verify", "m.onnx", "--source", torch_model("refuses_dispatch_modes"))
    assert verify.returncode == 3 and "could not read the source graph" in verify.stderr
    assert cli("verify", "m.onnx", "--source", torch_model("refuses_dispatch_modes"), "--no-gelu-guard").returncode == 0


@pytest.mark.parametrize(("to", "opset"), [("onnx", 17), ("tflite", None)], ids=["onnx", "tflite"])
def test_keras_dict_inputs_in_unsorted_order_are_read_by_name(tmp_path, to, opset):
    report = api.export(keras_model("dict_inputs_unsorted"), to=to, opset=opset, out=tmp_path / f"m.{to}")
    assert report.exit_code == 0, report.summary_lines()
    assert report.gelu_guard == "checked" and _statuses(report) == [("kept", "exact")]


def test_batchnorm_on_a_batch_of_one_is_captured_in_inference_mode(tmp_path):
    report = api.export(torch_model("batchnorm_batch1"), to="onnx", opset=13, out=tmp_path / "m.onnx")
    assert report.exit_code == 0, report.summary_lines()
    assert report.exporter == "torch.onnx (torchscript)"
    assert report.gelu_guard == "checked" and _statuses(report) == [("kept", "exact")]


def test_the_torchscript_export_leaves_the_model_in_inference_mode(tmp_path):
    source = load_source(torch_model("batchnorm_batch1"))
    feeds = make_batches(source, 0, 1)
    request = ExportRequest("onnx", 13, "torchscript", output_names=["output"], sample_inputs=feeds[0])
    route_for("torch", "onnx", "torchscript", None).export(source, request, tmp_path / "m.onnx", lambda _: None)
    assert not any(module.training for module in source.model.modules())


@pytest.mark.parametrize(("to", "opset"), [("onnx", 17), ("tflite", None)], ids=["onnx17", "tflite"])
def test_a_scale_the_next_linear_op_absorbs_is_kept_and_reported(tmp_path, to, opset):
    # 2 x tanh-GELU, the next Dense's kernel halved: what a converter folding GELU's 0.5 writes.
    exported = api.export(keras_model("tanh_gelu_twice_folded"), to=to, opset=opset, out=tmp_path / f"m.{to}")
    assert exported.exit_code == 0, exported.summary_lines()
    report = api.verify(tmp_path / f"m.{to}", source=keras_model("tanh_gelu_mlp"))
    assert report.exit_code == 0, report.summary_lines()
    [entry] = report.gelu
    assert entry["status"] == "kept" and entry["measured"] == "tanh"
    assert entry["scale"] == pytest.approx(2.0, rel=1e-4) and entry["source_scale"] == 1.0
    assert "absorbed by the" in entry["message"]


@pytest.mark.parametrize(("to", "opset"), [("onnx", 17), ("tflite", None)], ids=["onnx17", "tflite"])
def test_a_scale_nothing_absorbs_is_a_change(tmp_path, to, opset):
    exported = api.export(keras_model("tanh_gelu_twice_unfolded"), to=to, opset=opset, out=tmp_path / f"m.{to}")
    assert exported.exit_code == 0, exported.summary_lines()
    report = api.verify(tmp_path / f"m.{to}", source=keras_model("tanh_gelu_last"))
    assert report.exit_code == 3
    [entry] = report.gelu
    assert entry["status"] == "changed" and "nothing linear after it absorbs the scale" in entry["message"]
