"""A red verify is localised by default, also when the source was let go before the artifact ran
and had to be loaded again: keras.applications MobileNetV2 from a seeded factory (Keras numbers its
tensor names per process, so the second load names its input otherwise) with one convolution
weight changed in the ONNX and the TFLite artifact. The oracle is the fault injector's record (the
op it changed) and the Keras layer the exporter wrote into that op's name."""

import pytest

from exporter import api
from fixtures.inject_faults import inject_onnx, inject_tflite
from fixtures.localization_corpus import op_name

MOBILENET = "fixtures/models/localization_models.py:mobilenet_v2"
CONVOLUTIONS = ("Conv", "CONV_2D", "DEPTHWISE_CONV_2D")


# The TFLite artifact is the slow suite's: the reload path is the same, the ONNX case runs it by default.
@pytest.mark.parametrize("fmt", ["onnx", pytest.param("tflite", marks=pytest.mark.slow)])
def test_a_seeded_keras_factory_is_loaded_again_and_localised(tmp_path, fmt):
    from exporter.frameworks import load_source

    exported = tmp_path / f"mobilenet.{fmt}"
    assert api.export(MOBILENET, to=fmt, out=exported).exit_code == 0
    faulty = tmp_path / f"faulty.{fmt}"
    inject = inject_onnx if fmt == "onnx" else inject_tflite
    fault = next(f for f in (inject(exported, "weight_perturbed", faulty, seed=s) for s in range(6))
                 if f.op_type in CONVOLUTIONS)

    report = api.verify(faulty, source=MOBILENET)

    assert report.exit_code == 1, report.summary_lines()
    first = report.divergence["first"]
    assert first["index"] in fault.ops, (fault, report.divergence["message"])
    name = op_name(faulty, fmt, fault.op)  # the names the converter wrote for the op
    layers = {layer.name for layer in load_source(MOBILENET).model.layers}
    written = {level.rsplit("_", 1)[0] if level not in layers else level for level in name.replace(";", "/").split("/")}
    assert first["module"] in written & layers, (first, name)
