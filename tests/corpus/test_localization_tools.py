"""Localisation of artifacts other tools made, verified against their sources: onnxruntime's
transformer optimizer (fused SkipLayerNormalization, MatMul and Add fused into Gemm) on a
torch.onnx export, tf2onnx called by hand on a Keras model, onnx2tf's TFLite of a torch CNN (NHWC
throughout; slow, in its own Python 3.12 venv). Each is faulted as fixtures/inject_faults.py does;
the first divergence is the faulted op, a fused op naming the source ops it covers."""

from pathlib import Path

import onnx
import pytest

from exporter import api
from fixtures.inject_faults import inject_onnx, inject_tflite

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

MODELS = Path(__file__).resolve().parents[2] / "fixtures" / "models" / "localization_models.py"


def _first(report) -> dict:
    assert report.exit_code == 1, report.summary_lines()
    assert report.divergence.get("first"), report.divergence
    return report.divergence["first"]


@pytest.fixture(scope="module")
def optimized_bert(tmp_path_factory) -> Path:
    """BERT exported by torch.onnx (dynamo), then through onnxruntime.transformers' optimizer."""
    from onnxruntime.transformers.optimizer import optimize_model

    folder = tmp_path_factory.mktemp("ort")
    report = api.export(f"{MODELS}:bert", to="onnx", out=folder / "bert.onnx")
    assert report.exit_code == 0, report.summary_lines()
    path = folder / "optimized.onnx"
    optimize_model(str(folder / "bert.onnx"), model_type="bert", num_heads=2, hidden_size=32).save_model_to_file(str(path))
    assert {"SkipLayerNormalization", "Gemm"} <= {node.op_type for node in onnx.load(str(path)).graph.node}
    return path


def test_the_onnxruntime_optimizers_artifact_is_faithful(optimized_bert):
    report = api.verify(optimized_bert, source=f"{MODELS}:bert", localize=True)
    assert report.exit_code == 0, report.summary_lines()
    assert report.divergence["first"] is None and report.divergence["aligned"] > 0


@pytest.mark.parametrize("kind", ["layernorm_gamma", "weight_perturbed"])
def test_a_fault_in_a_fused_op_is_named_with_what_it_covers(optimized_bert, tmp_path, kind):
    fault = inject_onnx(optimized_bert, kind, tmp_path / "faulty.onnx", seed=1)
    node = onnx.load(str(tmp_path / "faulty.onnx"), load_external_data=False).graph.node[fault.op]

    first = _first(api.verify(tmp_path / "faulty.onnx", source=f"{MODELS}:bert"))

    assert (first["node"], first["op_type"]) == (node.name, node.op_type)
    if node.op_type == "SkipLayerNormalization":  # the residual add and the LayerNorm it fuses
        assert [op.split("_")[0] for op in first["covers"]][-2:] == ["add", "layer"], first["covers"]
        assert first["module"].endswith(".LayerNorm")


def test_tf2onnx_by_hand(tmp_path):
    """A Keras model converted with tf2onnx.convert.from_keras, not by exportgate."""
    import tensorflow as tf
    import tf2onnx

    from fixtures.models.localization_models import transformer_block

    model, example = transformer_block()
    signature = [tf.TensorSpec(example["tokens"].shape, tf.float32, name="tokens")]
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=signature, opset=17)
    onnx.save(proto, tmp_path / "block.onnx")
    clean = api.verify(tmp_path / "block.onnx", source=f"{MODELS}:transformer_block", localize=True)
    assert clean.exit_code == 0 and clean.divergence["first"] is None, clean.summary_lines()
    for kind in ("bias_zeroed", "add_to_sub"):
        fault = inject_onnx(tmp_path / "block.onnx", kind, tmp_path / "faulty.onnx")
        node = onnx.load(str(tmp_path / "faulty.onnx")).graph.node[fault.op]
        first = _first(api.verify(tmp_path / "faulty.onnx", source=f"{MODELS}:transformer_block"))
        assert first["node"] == node.name, (kind, first)
        assert first["module"] in {"attention/attention_output", "ffn_in", "ffn_out", "residual1", "residual2"}


@pytest.mark.slow
def test_onnx2tf_tflite_of_a_torch_cnn(tmp_path, onnx2tf):
    """onnx2tf turns the CNN's NCHW graph into NHWC: the artifact holds the source's tensors
    transposed, which localisation learns from the tensors it can tell apart."""
    exported = api.export(f"{MODELS}:cnn", to="onnx", opset=17, exporter="torchscript", out=tmp_path / "cnn.onnx")
    assert exported.exit_code == 0, exported.summary_lines()
    tflite = onnx2tf(tmp_path / "cnn.onnx", tmp_path / "onnx2tf", "-kt", "x")  # the input stays NCHW
    clean = api.verify(tflite, source=f"{MODELS}:cnn", localize=True)
    assert clean.exit_code == 0 and clean.divergence["first"] is None, clean.summary_lines()
    for kind in ("weight_perturbed", "bias_zeroed"):
        fault = inject_tflite(tflite, kind, tmp_path / "faulty.tflite")
        first = _first(api.verify(tmp_path / "faulty.tflite", source=f"{MODELS}:cnn"))
        assert first["index"] in fault.ops, (kind, fault, first)
        assert first["module"].startswith("features."), first
