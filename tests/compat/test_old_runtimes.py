"""opset_matrix.yaml's claims for old runtimes, checked against the real runtimes: onnxruntime
1.16.3 and 1.17.3 (Python 3.11) and tflite-runtime 2.7.0 and 2.8.0 (Python 3.9), each in a
cached venv of its own (runtime_venvs.py). Models are built here with torch / TensorFlow and
run there in a subprocess.

A test skips only when the interpreter or the package cannot be had on this machine (no such
interpreter, no distribution for it); a network error while building a venv fails. Each test that
checks a matrix claim checks the claim of the target whose runtime it runs, and says which fact it
confirms (`confirms`): a target's confirmed_by_test is asserted by a run that checks those facts.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from runtime_venvs import (
    ORT_1_16,
    ORT_1_17,
    TFLITE_2_7,
    TFLITE_2_8,
    RuntimeSpec,
    Unavailable,
    run_model,
    runtime_venv,
)

from tests.conftest import tool_missing
from verifiers.target_matrix import load_targets
from verifiers.tflite_model import load_tflite, used_ops

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:Statistics for quantized inputs were expected"),
]

# Matrix target -> the runtime its tests run in.
RUNTIMES = {"ort-1.16": ORT_1_16, "ort-1.17": ORT_1_17, "tflite-2.7": TFLITE_2_7, "tflite-2.8": TFLITE_2_8}

X = np.array([-5.0, -1.0, 0.5, 2.0], dtype=np.float32)
ERF = np.array([math.erf(v) for v in X / math.sqrt(2)], dtype=np.float32)
EXACT = 0.5 * X * (1 + ERF)
TANH = 0.5 * X * (1 + np.tanh(math.sqrt(2 / math.pi) * (X + 0.044715 * X**3)))
QUICK = X / (1 + np.exp(-1.702 * X))


@pytest.fixture(scope="module")
def shipped():
    return load_targets()


def venv_of(spec: RuntimeSpec):
    try:
        return runtime_venv(spec)
    except Unavailable as exc:
        tool_missing(f"{spec.describe()} cannot be had here: {exc}")


def confirms(fact: str, *targets: str):
    """The test checks `fact` of each target's matrix entry against that target's runtime: it runs
    once per target (argument `target`)."""
    def mark(test):
        test.confirms = (fact, targets)
        return pytest.mark.parametrize("target", targets)(test)
    return mark


def refusal(result, stage: str = "load") -> str:
    assert not result.ok, f"{result.version} ran a model it was expected to refuse"
    assert result.stage == stage, str(result)
    return result.error


# ------------------------------------------------------------------------------ onnxruntime


def one_node_model(op: str, opset: int, domain: str = "", dtype=TensorProto.FLOAT, n_inputs=1, **attrs):
    names = ["x", "b"][:n_inputs]
    inputs = [helper.make_tensor_value_info(n, dtype, [4]) for n in names]
    output = helper.make_tensor_value_info("y", dtype, [4])
    node = helper.make_node(op, names, ["y"], domain=domain, **attrs)
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(helper.make_graph([node], "g", inputs, [output]), opset_imports=imports)
    model.ir_version = 9  # onnxruntime 1.16 and 1.17 read IR <= 9: a refusal must be the opset's
    return model


def run_onnx(spec: RuntimeSpec, model: onnx.ModelProto, tmp_path, *inputs, **kw):
    path = tmp_path / f"{model.graph.node[0].op_type}-{model.opset_import[0].version}.onnx"
    onnx.save(model, str(path))
    return run_model(venv_of(spec), "onnx", path, list(inputs), **kw)


@pytest.fixture(scope="module")
def mlp_exports(tmp_path_factory):
    """fixtures' mlp_exact exported by the TorchScript exporter at opsets 17 and 20, and torch's output."""
    import torch

    from fixtures.models.torch_models import mlp_exact

    model, (x,) = mlp_exact()
    folder = tmp_path_factory.mktemp("mlp")
    paths = {}
    for opset in (17, 20):
        paths[opset] = folder / f"mlp_exact-{opset}.onnx"
        torch.onnx.export(model, (x,), str(paths[opset]), dynamo=False, opset_version=opset)
    with torch.no_grad():
        expected = model(x).numpy()
    return paths, x.numpy(), expected


def node_types(path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path)).graph.node]


def test_mlp_exports_are_what_the_tests_assume(mlp_exports):
    paths, _, _ = mlp_exports
    assert "Gelu" in node_types(paths[20]) and onnx.load(str(paths[20])).opset_import[0].version == 20
    assert "Gelu" not in node_types(paths[17]) and "Erf" in node_types(paths[17])
    assert all(onnx.load(str(p)).ir_version <= 9 for p in paths.values())


@confirms("max_opset", "ort-1.16", "ort-1.17")
def test_ort_max_opset(target, shipped, tmp_path):
    spec, max_opset = RUNTIMES[target], shipped[target].max_opset
    assert run_onnx(spec, one_node_model("Relu", max_opset), tmp_path, X).ok
    error = refusal(run_onnx(spec, one_node_model("Relu", max_opset + 1), tmp_path, X))
    assert f"Current official support for domain ai.onnx is till opset {max_opset}." in error


@confirms("gelu.gelu_op", "ort-1.16")
def test_ort_1_16_refuses_the_gelu_20_export(target, shipped, mlp_exports):
    assert shipped[target].gelu["gelu_op"] is False
    paths, x, _ = mlp_exports
    error = refusal(run_model(venv_of(RUNTIMES[target]), "onnx", paths[20], [x]))
    assert "Opset 20 is under development" in error
    assert "Current official support for domain ai.onnx is till opset 19." in error


@confirms("gelu.gelu_op", "ort-1.16")
def test_ort_1_16_refuses_a_one_node_gelu_20(target, shipped, tmp_path):
    assert shipped[target].gelu["gelu_op"] is False
    error = refusal(run_onnx(RUNTIMES[target], one_node_model("Gelu", 20, approximate="none"), tmp_path, X))
    assert "till opset 19" in error


@confirms("gelu.gelu_op", "ort-1.17")
def test_ort_1_17_runs_the_gelu_20_export_by_function_expansion(target, shipped, mlp_exports, tmp_path):
    assert shipped[target].gelu["gelu_op"] is True
    paths, x, expected = mlp_exports
    loaded = tmp_path / "as-loaded.onnx"
    result = run_model(venv_of(RUNTIMES[target]), "onnx", paths[20], [x], save_graph=loaded)
    assert result.ok, str(result)
    np.testing.assert_allclose(result.outputs[0], expected, atol=1e-5, rtol=0)
    # No native kernel: the graph as loaded holds Gelu's function body (Erf ...), not Gelu.
    ops = node_types(loaded)
    assert "Gelu" not in ops and "Erf" in ops, ops


@confirms("gelu.gelu_op", "ort-1.17")
def test_ort_1_17_runs_one_node_gelu_20_both_flavours(target, shipped, tmp_path):
    assert shipped[target].gelu["gelu_op"] is True
    exact = run_onnx(RUNTIMES[target], one_node_model("Gelu", 20, approximate="none"), tmp_path, X)
    tanh = run_onnx(RUNTIMES[target], one_node_model("Gelu", 20, approximate="tanh"), tmp_path, X)
    assert exact.ok and tanh.ok, f"{exact} / {tanh}"
    np.testing.assert_allclose(exact.outputs[0], EXACT, atol=1e-6)
    np.testing.assert_allclose(tanh.outputs[0], TANH, atol=1e-6)


@confirms("gelu.erf", "ort-1.16", "ort-1.17")
def test_ort_runs_the_opset_17_erf_export(target, shipped, mlp_exports):
    assert shipped[target].gelu["erf"] is True
    paths, x, expected = mlp_exports
    result = run_model(venv_of(RUNTIMES[target]), "onnx", paths[17], [x])
    assert result.ok, str(result)
    np.testing.assert_allclose(result.outputs[0], expected, atol=1e-5, rtol=0)


@confirms("gelu.contrib_gelu", "ort-1.16", "ort-1.17")
def test_ort_contrib_gelu_ops_run(target, shipped, tmp_path):
    assert shipped[target].gelu["contrib_gelu"] is True
    spec, ms = RUNTIMES[target], "com.microsoft"
    bias = np.full(4, 0.25, dtype=np.float32)
    bias_exact = 0.5 * (X + bias) * (1 + np.array([math.erf(v) for v in (X + bias) / math.sqrt(2)]))
    cases = [
        (one_node_model("Gelu", 17, ms), (X,), EXACT),
        (one_node_model("FastGelu", 17, ms), (X,), TANH),
        (one_node_model("QuickGelu", 17, ms), (X,), QUICK),
        (one_node_model("BiasGelu", 17, ms, n_inputs=2), (X, bias), bias_exact),
    ]
    for model, inputs, expected in cases:
        result = run_onnx(spec, model, tmp_path, *inputs)
        assert result.ok, f"{model.graph.node[0].op_type}: {result}"
        np.testing.assert_allclose(result.outputs[0], expected, atol=1e-6, err_msg=model.graph.node[0].op_type)


# ------------------------------------------------------------------------------- TF Lite

TANH_CHAIN = "0.5*x*(1+tanh(0.7978845608*(x+0.044715*x*x*x)))"


@pytest.fixture(scope="module")
def tflite_models(tmp_path_factory):
    """Tiny Keras models converted by the installed TF: name -> (path, input, Keras output)."""
    import keras
    import tensorflow as tf

    def tanh_chain(x):
        return 0.5 * x * (1 + keras.ops.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))

    layers = {
        "gelu": lambda: keras.layers.Activation("gelu"),  # exact
        "gelu_tanh": lambda: keras.layers.Lambda(lambda t: keras.ops.gelu(t)),  # approximate=True
        "tanh_chain": lambda: keras.layers.Lambda(tanh_chain),
        "sign": lambda: keras.layers.Lambda(lambda t: tf.sign(t) * t),
    }
    folder = tmp_path_factory.mktemp("tflite")
    x = np.linspace(-4, 4, 64, dtype=np.float32).reshape(4, 16)
    models = {}
    for name, layer in layers.items():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16), layer(), keras.layers.Dense(4)])
        path = folder / f"{name}.tflite"
        path.write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
        models[name] = (path, x, np.asarray(model(x)))

    # Full int8 GELU (op version 2), int8 in and out.
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Activation("gelu")])
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([(x[:1] * s).astype(np.float32)] for s in np.linspace(0.2, 1, 20))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = converter.inference_output_type = tf.int8
    path = folder / "gelu_int8.tflite"
    path.write_bytes(converter.convert())
    tensor = load_tflite(path).subgraphs[0].tensors[load_tflite(path).subgraphs[0].inputs[0]]
    x8 = np.clip(np.round(x / tensor.scale + tensor.zero_point), -128, 127).astype(np.int8)
    models["gelu_int8"] = (path, x8, None)
    return models


def ops_of(path) -> list[tuple[str, int]]:
    return used_ops(load_tflite(path))


def run_tflite(spec: RuntimeSpec, models, name: str):
    path, x, _ = models[name]
    return run_model(venv_of(spec), "tflite", path, [x])


def test_tflite_models_are_what_the_tests_assume(tflite_models):
    ops = {name: ops_of(path) for name, (path, _, _) in tflite_models.items()}
    assert ("GELU", 1) in ops["gelu"] and ("GELU", 1) in ops["gelu_tanh"]
    assert ("GELU", 2) in ops["gelu_int8"]
    assert not any(op == "GELU" for op, _ in ops["tanh_chain"]), ops["tanh_chain"]  # x*x*x is not fused
    assert {"MUL", "ADD", "TANH"} <= {op for op, _ in ops["tanh_chain"]}
    assert ("SIGN", 1) in ops["sign"]
    meta = {name: load_tflite(path).metadata_text("min_runtime_version") for name, (path, _, _) in tflite_models.items()}
    assert meta == {"gelu": "2.9.0", "gelu_tanh": "2.9.0", "gelu_int8": "2.9.0", "tanh_chain": "1.14.0",
                    "sign": "2.11.0"}


@confirms("gelu.builtin", "tflite-2.7")
def test_tflite_2_7_refuses_the_gelu_builtin(target, shipped, tflite_models):
    assert shipped[target].gelu["builtin"] is False
    error = refusal(run_tflite(RUNTIMES[target], tflite_models, "gelu"))
    assert "Op builtin_code out of range: 150. Are you using old TFLite binary with newer model?" in error


@confirms("gelu.builtin_int8", "tflite-2.7")
def test_tflite_2_7_refuses_the_int8_gelu_builtin(target, shipped, tflite_models):
    assert shipped[target].gelu["builtin_int8"] is False
    error = refusal(run_tflite(RUNTIMES[target], tflite_models, "gelu_int8"))
    assert "Op builtin_code out of range: 150. Are you using old TFLite binary with newer model?" in error


@confirms("gelu.builtin", "tflite-2.8")
@pytest.mark.parametrize("name", ["gelu", "gelu_tanh"])
def test_tflite_2_8_runs_the_float_gelu_builtin_with_its_flavour(target, shipped, tflite_models, name):
    # runtime_version.cc says GELU needs 2.9.0 (the converter writes that as min_runtime_version),
    # but the 2.8.0 runtime has the float kernel, and honours GeluOptions.approximate.
    assert shipped[target].gelu["builtin"] is True
    result = run_tflite(RUNTIMES[target], tflite_models, name)
    assert result.ok, str(result)
    np.testing.assert_allclose(result.outputs[0], tflite_models[name][2], atol=1e-5, rtol=0)


@confirms("gelu.builtin_int8", "tflite-2.8")
def test_tflite_2_8_refuses_the_int8_gelu_builtin(target, shipped, tflite_models):
    assert shipped[target].gelu["builtin_int8"] is False
    error = refusal(run_tflite(RUNTIMES[target], tflite_models, "gelu_int8"))
    assert "Didn't find op for builtin opcode 'GELU' version '2'." in error


@confirms("gelu.tanh_chain", "tflite-2.7", "tflite-2.8")
def test_tflite_runs_the_tanh_chain(target, shipped, tflite_models):
    assert shipped[target].gelu["tanh_chain"] is True
    result = run_tflite(RUNTIMES[target], tflite_models, "tanh_chain")
    assert result.ok, str(result)
    np.testing.assert_allclose(result.outputs[0], tflite_models["tanh_chain"][2], atol=1e-5, rtol=0)


@confirms("gelu.sign_op", "tflite-2.7", "tflite-2.8")
def test_tflite_refuses_sign(target, shipped, tflite_models):
    assert shipped[target].gelu["sign_op"] is False
    error = refusal(run_tflite(RUNTIMES[target], tflite_models, "sign"))
    assert "Op builtin_code out of range: 158." in error


# ------------------------------------------------------------------------ the matrix's record


@pytest.mark.parametrize("target", sorted(RUNTIMES))
def test_confirmed_by_test_lists_what_this_run_confirms(request, shipped, target):
    """The record holds for a run that checks it: with the target's runtime here and every test
    that confirms one of its facts in this run. Otherwise nothing confirmed it, and this skips."""
    venv_of(RUNTIMES[target])
    checks = [test for name, test in globals().items()
              if name.startswith("test_") and target in getattr(test, "confirms", ("", ()))[1]]
    running = {item.function for item in request.session.items
               if getattr(item, "function", None) in checks and item.callspec.params["target"] == target}
    missing = sorted({test.confirms[0] for test in checks if test not in running})
    if missing:
        pytest.skip(f"tests checking {', '.join(missing)} of {target} are not in this run: it confirms no record")
    assert set(shipped[target].confirmed_by_test) == {test.confirms[0] for test in checks}
