"""`exportgate check ARTIFACT --target NAME` as a library: real exports and conversions checked
against the shipped opset_matrix.yaml (and a user matrix for flags no shipped target sets)."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper

from verifiers.target_matrix import load_targets
from fixtures import make_broken_tflite as mbt
from fixtures.children import run_child
from verifiers.report import Report
from verifiers.target_check import check_artifact, to_findings
from verifiers.target_facts import Incompatibility, gap_op_and_dtypes, version_greater

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def targets():
    return load_targets()


def kinds(incompatibilities: list[Incompatibility]) -> list[str]:
    return sorted(i.kind for i in incompatibilities)


# ---- artifacts -------------------------------------------------------------------------------------


def _hand_model(nodes, elem_type: int, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "handmade",
        [helper.make_tensor_value_info("x", elem_type, ["n", 8])],
        [helper.make_tensor_value_info("y", elem_type, ["n", 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(model)
    return model


def _shared_folder(tmp_path_factory) -> Path:
    """A folder all xdist workers of this session share (the session's own folder without xdist),
    so each group of artifacts is built once: only one worker imports torch or TensorFlow."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "target_check"


def _built_once(folder: Path, group: str, names: tuple[str, ...], suffix: str, build) -> Callable[[str], Path]:
    """name -> path of the group's artifacts, `build(name) -> bytes` run for the whole group by
    the first worker that asks (under a file lock), reused by the others."""
    from filelock import FileLock

    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / f"{group}.lock")):
        done = folder / f"{group}.done"
        if not done.exists():
            for name in names:
                (folder / f"{name}{suffix}").write_bytes(build(name))
            done.write_text("built\n")
    return lambda name: folder / f"{name}{suffix}"


ONNX_ARTIFACTS = ("gelu20", "erf17", "fastgelu", "erf_float64", "int16_roundtrip")
TFLITE_ARTIFACTS = ("gelu", "gelu_int8", "sign", "flex_erf")


def _torch_mlp(opset: int, shape: tuple[int, ...]) -> onnx.ModelProto:
    """Linear-GELU-Linear through torch.onnx's TorchScript exporter (opset honoured exactly)."""
    import io

    import torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8)).eval()
    buffer = io.BytesIO()
    torch.onnx.export(module, (torch.randn(*shape),), buffer, opset_version=opset, dynamo=False,
                      input_names=["x"], output_names=["y"])
    return onnx.load_from_string(buffer.getvalue())


def _build_onnx(name: str) -> bytes:
    if name == "gelu20":  # one Gelu-20 node
        model = _torch_mlp(20, (2, 8))
    elif name == "erf17":  # Div/Erf/Add/Mul/Mul
        model = _torch_mlp(17, (2, 8))
    elif name == "fastgelu":  # exact GELU fused, then approximated: com.microsoft.FastGelu
        from onnxruntime.transformers.fusion_options import FusionOptions
        from onnxruntime.transformers.optimizer import optimize_model

        options = FusionOptions("bert")
        options.enable_gelu_approximation = True
        model = optimize_model(_torch_mlp(17, (1, 4, 8)), model_type="bert", opt_level=0,
                               optimization_options=options).model
    elif name == "erf_float64":
        model = _hand_model([helper.make_node("Erf", ["x"], ["y"], name="erf64")], TensorProto.DOUBLE)
    elif name == "int16_roundtrip":
        model = _hand_model([
            helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.INT16, name="to_int16"),
            helper.make_node("Cast", ["x16"], ["y"], to=TensorProto.FLOAT, name="to_float"),
        ], TensorProto.FLOAT)
    else:
        raise ValueError(name)
    return model.SerializeToString()


def _keras_conversion(layer, **settings) -> bytes:
    """Dense-layer-Dense (16 -> 32 -> 4) through tf.lite.TFLiteConverter.from_keras_model."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    features = keras.Input((16,), name="features")
    hidden = layer(keras.layers.Dense(32)(features))
    converter = tf.lite.TFLiteConverter.from_keras_model(keras.Model(features, keras.layers.Dense(4)(hidden)))
    for key, value in settings.items():
        if key == "supported_ops":
            converter.target_spec.supported_ops = value
        else:
            setattr(converter, key, value)
    return bytes(converter.convert())


def _build_tflite(name: str) -> bytes:
    if name == "gelu":  # Activation('gelu'): the GELU builtin, op version 1
        return mbt.faithful_conversion("functional_activation")
    import keras
    import tensorflow as tf

    if name == "gelu_int8":  # full int8: GELU op version 2
        rng = np.random.default_rng(0)

        def dataset():
            for _ in range(4):
                yield [rng.standard_normal((1, 16)).astype(np.float32)]

        return _keras_conversion(keras.layers.Activation("gelu"), optimizations=[tf.lite.Optimize.DEFAULT],
                                 representative_dataset=dataset, supported_ops=[tf.lite.OpsSet.TFLITE_BUILTINS_INT8])
    if name == "sign":  # x * sign(x): the SIGN builtin (runtime 2.11)
        return _keras_conversion(keras.layers.Lambda(lambda t: keras.ops.sign(t) * t))
    if name == "flex_erf":  # no ERF builtin: FlexErf
        return _keras_conversion(keras.layers.Lambda(lambda t: tf.math.erf(t)),
                                 supported_ops=[tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS])
    raise ValueError(name)


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    """name -> path: torch.onnx exports of Linear-GELU-Linear (opset 17 erf chain, opset 20 Gelu),
    onnxruntime.transformers' FastGelu rewrite of the first, and onnx.helper graphs."""
    return _built_once(_shared_folder(tmp_path_factory), "onnx", ONNX_ARTIFACTS, ".onnx", _build_onnx)


@pytest.fixture(scope="module")
def tflite_file(tmp_path_factory):
    """name -> path: tf.lite.TFLiteConverter conversions of small Keras models."""
    return _built_once(_shared_folder(tmp_path_factory), "tflite", TFLITE_ARTIFACTS, ".tflite", _build_tflite)


# ---- ONNX ------------------------------------------------------------------------------------------


def test_gelu20_flagged_for_ort_116(onnx_file, targets):
    found = check_artifact(onnx_file("gelu20"), targets["ort-1.16"])
    assert kinds(found) == ["gelu", "opset"]
    opset = next(i for i in found if i.kind == "opset")
    assert opset.detail["opset"] == 20 and opset.detail["max_opset"] == 19
    assert "opset 20" in opset.message and "max_opset: 19" in opset.message
    assert "onnxruntime.ai/docs/reference/compatibility.html" in opset.message
    gelu = next(i for i in found if i.kind == "gelu")
    assert gelu.detail["site"].startswith("0:") and gelu.detail["op"] == "Gelu"
    assert gelu.detail["fact"] == "gelu.gelu_op" and gelu.detail["sources"]
    assert gelu.message.startswith(f"GELU site {gelu.detail['site']} uses Gelu (opset 20")
    assert "ort-1.16 has no Gelu-20" in gelu.message and "gelu.gelu_op: false" in gelu.message
    assert all("\n" not in i.message for i in found)

    findings = to_findings(found, targets["ort-1.16"])
    assert sorted(f.kind for f in findings) == ["opset", "target"]
    assert next(f for f in findings if f.kind == "target").site == gelu.detail["site"]
    report = Report(command="check")
    report.failures.extend(findings)
    assert report.exit_code == 4


@pytest.mark.parametrize("name", ["ort-1.17", "ort-1.18", "ort-1.32", "tensorrt-10.15"])
def test_gelu20_clean_where_gelu20_runs(onnx_file, targets, name):
    assert check_artifact(onnx_file("gelu20"), targets[name]) == []


def test_gelu20_flagged_for_tensorrt_86(onnx_file, targets):
    found = check_artifact(onnx_file("gelu20"), targets["tensorrt-8.6"])
    assert kinds(found) == ["gelu", "opset"]
    assert "max_opset: 17" in next(i.message for i in found if i.kind == "opset")


@pytest.mark.parametrize("name", ["ort-1.14", "ort-1.16", "ort-1.32", "tensorrt-8.6", "tensorrt-10.15"])
def test_opset17_erf_chain_clean(onnx_file, targets, name):
    """float32 Erf: not the float64 gap ort-1.32 lists."""
    assert check_artifact(onnx_file("erf17"), targets[name]) == []


@pytest.mark.parametrize("name", ["tensorrt-8.6", "tensorrt-10.15"])
def test_fastgelu_flagged_for_tensorrt(onnx_file, targets, name):
    """contrib_gelu is null (no claim) for TensorRT, but its runtime is not onnxruntime."""
    (found,) = check_artifact(onnx_file("fastgelu"), targets[name])
    assert found.kind == "gelu" and found.detail["site_op"] == "com.microsoft.FastGelu"
    assert found.detail["fact"] == "runtime" and found.detail["runtime"] == "tensorrt"
    assert "uses com.microsoft.FastGelu" in found.message and "matrix runtime: tensorrt" in found.message
    assert [f.kind for f in to_findings([found], targets[name])] == ["target"]


@pytest.mark.parametrize("name", ["ort-1.16", "ort-1.32", "ort-web-1.22-wasm"])
def test_fastgelu_clean_on_onnxruntime(onnx_file, targets, name):
    """contrib_gelu true, or null for an onnxruntime-family runtime: no claim, nothing flagged."""
    assert check_artifact(onnx_file("fastgelu"), targets[name]) == []


def test_float64_erf_hits_the_ort_132_op_gap(onnx_file, targets):
    (found,) = check_artifact(onnx_file("erf_float64"), targets["ort-1.32"])
    assert found.kind == "op" and found.detail["dtype"] == "float64" and found.detail["nodes"] == ["erf64"]
    assert found.detail["fact"] == "op_gaps" and found.detail["gap"]["op"] == "Erf"
    assert "Erf on float64 input at 1 node (erf64)" in found.message and "op_gaps: Erf" in found.message
    # ort-1.16 lists no op gaps; onnx.helper stamps a newer IR version than 1.16 loads
    assert [i.kind for i in check_artifact(onnx_file("erf_float64"), targets["ort-1.16"])] == ["ir_version"]
    assert check_artifact(onnx_file("erf_float64"), targets["tensorrt-10.15"]) == []  # DOUBLE is listed


def test_ir_version_above_the_target(onnx_file, targets):
    (found,) = check_artifact(onnx_file("erf_float64"), targets["ort-1.16"])
    assert found.kind == "ir_version" and found.detail["max_ir_version"] == 9
    assert "max_ir_version: 9" in found.message and "onnxruntime.ai" in found.message


def test_dtype_outside_the_targets_list(onnx_file, targets):
    (found,) = check_artifact(onnx_file("int16_roundtrip"), targets["tensorrt-10.15"])
    assert found.kind == "dtype" and found.detail["dtype"] == "int16" and found.detail["tensors"] == ["x16"]
    assert "github.com/onnx/onnx-tensorrt" in found.message
    assert check_artifact(onnx_file("int16_roundtrip"), targets["ort-1.32"]) == []  # no dtypes listed


def test_every_incompatibility_is_flagged(onnx_file, targets, tmp_path):
    """A user target that lacks everything: opset, Erf (in the GELU site), contrib ops on an
    onnxruntime runtime, and a dtype-qualified op gap, all reported together."""
    sources = [{"fact": f, "source": "user notes", "quote": "probed"}
               for f in ("max_opset", "gelu.gelu_op", "gelu.erf", "gelu.contrib_gelu", "op_gaps")]
    entry = {
        "format": "onnx", "runtime": "onnxruntime", "version": "0.1", "max_opset": 16,
        "gelu": {"gelu_op": False, "erf": False, "contrib_gelu": False},
        "op_gaps": [{"op": "MatMul[float32]", "note": "no float32 MatMul"}], "sources": sources,
    }
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({"schema": 1, "targets": {"mini-0.1": entry}}), encoding="utf-8")
    target = load_targets(path)["mini-0.1"]

    found = check_artifact(onnx_file("erf17"), target)
    assert kinds(found) == ["gelu", "opset"]
    erf = next(i for i in found if i.kind == "gelu")
    assert erf.detail["site_op"] == "erf-chain" and erf.detail["fact"] == "gelu.erf"
    assert "(erf-chain) uses Erf at node" in erf.message

    found = check_artifact(onnx_file("fastgelu"), target)
    assert kinds(found) == ["gelu", "op", "opset"]
    contrib = next(i for i in found if i.kind == "gelu")
    assert contrib.detail["fact"] == "gelu.contrib_gelu" and "gelu.contrib_gelu: false" in contrib.message
    gap = next(i for i in found if i.kind == "op")
    assert gap.detail["op"] == "MatMul" and gap.detail["dtype"] == "float32" and len(gap.detail["nodes"]) == 2


# ---- TFLite ----------------------------------------------------------------------------------------


def test_gelu_builtin_flagged_for_tflite_27(tflite_file, targets):
    found = check_artifact(tflite_file("gelu"), targets["tflite-2.7"])
    assert kinds(found) == ["gelu", "runtime_version"]
    gelu = next(i for i in found if i.kind == "gelu")
    assert gelu.detail["fact"] == "gelu.builtin" and gelu.detail["site"].startswith("0:")
    assert "GELU builtin (op version 1, float)" in gelu.message and "tflite-2.7 lacks it" in gelu.message
    assert [f.kind for f in to_findings(found, targets["tflite-2.7"])] == ["target", "target"]


def test_gelu_builtin_flagged_for_tflite_28_by_its_runtime_version(tflite_file, targets):
    # tflite-runtime 2.8.0 has the float GELU kernel, but the file says it needs 2.9.0
    # (runtime_version.cc), and the gate goes by what the file claims.
    [found] = check_artifact(tflite_file("gelu"), targets["tflite-2.8"])
    assert found.kind == "runtime_version"
    assert found.detail["min_runtime_version"] == "2.9.0"
    assert found.detail["min_runtime_version_source"] == "metadata"
    assert found.detail["ops"] == [["GELU", 1]]
    assert "min_runtime_version 2.9.0" in found.message and "max_runtime_version: 2.8" in found.message


def test_gelu_builtin_flagged_for_the_gpu_delegate(tflite_file, targets):
    (found,) = check_artifact(tflite_file("gelu"), targets["tflite-2.9-gpu"])
    assert found.kind == "gelu" and found.detail["fact"] == "gelu.builtin"
    assert "gpu delegate of tflite-2.9-gpu does not take it" in found.message
    assert "keras_cv_attention_models/issues/137" in found.message


@pytest.mark.parametrize("name", ["tflite-2.9", "tflite-2.16", "litert-2.3", "litert-2.3-xnnpack"])
def test_gelu_builtin_clean(tflite_file, targets, name):
    """2.9.0 == 2.9: version parts missing on one side count as 0."""
    assert check_artifact(tflite_file("gelu"), targets[name]) == []


def test_int8_gelu_uses_the_int8_flag(tflite_file, targets):
    path = tflite_file("gelu_int8")
    (found,) = check_artifact(path, targets["tflite-2.9-gpu"])
    assert found.detail["fact"] == "gelu.builtin_int8" and "op version 2" in found.message
    assert check_artifact(path, targets["tflite-2.9"]) == []
    assert check_artifact(path, targets["litert-2.3-xnnpack"]) == []  # builtin_int8 null: no claim


def test_sign_needs_211(tflite_file, targets):
    found = check_artifact(tflite_file("sign"), targets["tflite-2.9"])
    assert kinds(found) == ["op", "runtime_version"]
    assert next(i for i in found if i.kind == "op").detail["fact"] == "gelu.sign_op"
    assert "SIGN v1 needs 2.11.0" in next(i.message for i in found if i.kind == "runtime_version")
    assert check_artifact(tflite_file("sign"), targets["tflite-2.11"]) == []


@pytest.mark.parametrize("name", ["litert-2.3", "tflite-2.16", "tflite-2.9-gpu"])
def test_flex_ops_are_always_flagged(tflite_file, targets, name):
    (found,) = check_artifact(tflite_file("flex_erf"), targets[name])
    assert found.kind == "op" and found.detail["op"] == "FlexErf" and found.detail["flex"]
    assert "Flex op FlexErf" in found.message
    has_gap = bool(targets[name].op_gaps)  # ERF is an op gap of the CPU runtimes
    assert (found.detail["gap"] is not None) == has_gap and ("op_gaps: ERF" in found.message) == has_gap


# ---- format and helpers ------------------------------------------------------------------------


def test_format_mismatch(tflite_file, onnx_file, targets):
    (found,) = check_artifact(tflite_file("gelu"), targets["ort-1.32"])
    assert found.kind == "format" and "TFLite artifact" in found.message and "ONNX artifacts" in found.message
    assert [f.kind for f in to_findings([found], targets["ort-1.32"])] == ["target"]
    (found,) = check_artifact(onnx_file("gelu20"), targets["tflite-2.9"])
    assert found.kind == "format" and found.detail == {"artifact_format": "onnx", "target_format": "tflite",
                                                       "fact": "format"}


def test_version_comparison_is_numeric():
    assert version_greater("2.9.0", "2.8") and version_greater("2.10", "2.9") and version_greater("2.11.0", "2.9")
    assert not version_greater("2.9.0", "2.9") and not version_greater("2.9", "2.9.0")
    assert not version_greater("1.14.0", "2.8")


def test_op_gap_dtype_is_read_from_the_matrix(targets):
    (gap,) = targets["ort-1.32"].op_gaps
    assert gap_op_and_dtypes(gap) == ("Erf", frozenset({"float64"}))
    (gap,) = targets["litert-2.3"].op_gaps
    assert gap_op_and_dtypes(gap) == ("ERF", None)


def test_incompatibility_kind_is_checked():
    with pytest.raises(ValueError):
        Incompatibility("numeric", "x")


def test_no_tensorflow_or_torch_import(tflite_file, onnx_file):
    code = textwrap.dedent(f"""
        import sys
        from verifiers.target_matrix import load_targets
        from verifiers.target_check import check_artifact
        targets = load_targets()
        assert check_artifact({str(tflite_file("gelu"))!r}, targets["tflite-2.8"])
        assert check_artifact({str(onnx_file("gelu20"))!r}, targets["ort-1.16"])
        bad = sorted(m for m in ("tensorflow", "torch", "keras") if m in sys.modules)
        assert not bad, bad
    """)
    result = run_child([sys.executable, "-c", code], cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_float16_artifact_is_told_what_its_float16_ops_compute_in_there(tmp_path):
    """Not an incompatibility: a note with the matrix's fact and its source, where it makes one."""
    from exporter import api

    for elem_type, name in ((TensorProto.FLOAT16, "half.onnx"), (TensorProto.FLOAT, "single.onnx")):
        onnx.save(_hand_model([helper.make_node("Mul", ["x", "x"], ["y"])], elem_type), str(tmp_path / name))
    notes = {}
    for name in ("half.onnx", "single.onnx"):
        for target in ("tensorrt-10.15", "ort-1.32", "tensorrt-8.6"):
            report = api.check(tmp_path / name, target=target)
            assert report.exit_code == 0, report.summary_lines()
            notes[name, target] = [note for note in report.notes if "float16 ops" in note]
    [gpu] = notes["half.onnx", "tensorrt-10.15"]
    assert gpu.startswith("tensorrt-10.15: the artifact's float16 ops compute in float16 there") and "NvInfer.h" in gpu
    [cpu] = notes["half.onnx", "ort-1.32"]
    assert cpu.startswith("ort-1.32: the artifact's float16 ops are cast up to float32 there") and "insert_cast" in cpu
    assert notes["half.onnx", "tensorrt-8.6"] == []  # the matrix claims nothing there
    assert all(notes["single.onnx", target] == [] for target in ("tensorrt-10.15", "ort-1.32", "tensorrt-8.6"))
