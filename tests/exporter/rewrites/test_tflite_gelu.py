"""lower_gelu_ops on real conversions: no GELU builtin left, same outputs in both resolvers, the
same flavour per site as the guard measures it, signatures and runtime metadata right."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.rewrites import lower_gelu_ops
from fixtures import make_broken_tflite as mbt
from verifiers.gelu import EXACT, TANH
from verifiers.formats.tflite.gelu_inventory import tflite_inventory
from verifiers.formats.tflite.gelu_sites import (
    find_tflite_relu_sites,
    find_tflite_sites,
    tflite_activation_sites,
)
from verifiers.tflite_model import (
    MIN_RUNTIME_VERSION_KEY,
    parse_tflite,
    schema,
    used_ops,
)
from verifiers.tflite_runtime_versions import min_runtime_version_for

# Builtins in every TFLite runtime since well before 2.7 (op version 1), what the lowering may add.
OLD_BUILTINS = {"MUL", "ADD", "SUB", "DIV", "TANH", "EXP", "NEG", "RELU"}
SOURCES = {  # builder -> flavour of each GELU site
    "functional_activation": (EXACT,),  # Activation('gelu'): exact
    "functional_ops": (TANH,),  # keras.ops.gelu: tanh
    "two_gelu_exact": (EXACT, EXACT),
}


def run(content: bytes, x: np.ndarray, delegates: bool) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    resolver = OpResolverType.AUTO if delegates else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    interpreter = Interpreter(model_content=content, num_threads=1, experimental_op_resolver_type=resolver)
    detail = interpreter.get_input_details()[0]
    interpreter.resize_tensor_input(detail["index"], list(x.shape))
    interpreter.allocate_tensors()
    interpreter.set_tensor(detail["index"], x)
    interpreter.invoke()
    return np.array(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]))


def measured(content: bytes) -> list[tuple[str, str, bool]]:
    return [(e.site.op, e.measured, e.confident) for e in tflite_inventory(parse_tflite(content))]


def io_names(content: bytes) -> tuple:
    model = parse_tflite(content)
    sg = model.subgraphs[0]
    return ([(s.key, s.inputs, s.outputs) for s in model.signatures],
            [sg.tensors[i].name for i in sg.inputs], [sg.tensors[i].name for i in sg.outputs])


def check_lowered(original: bytes, lowered: bytes, flavours: tuple[str, ...], x: np.ndarray) -> None:
    model = parse_tflite(lowered)
    names = {name for name, _ in used_ops(model)}
    assert "GELU" not in {op.name for op in model.opcodes} and "SIGN" not in names
    assert not any(op.custom for op in model.opcodes)
    assert names - {name for name, _ in used_ops(parse_tflite(original))} <= OLD_BUILTINS
    assert all(version == 1 for name, version in used_ops(model) if name in OLD_BUILTINS)
    for delegates in (True, False):
        np.testing.assert_allclose(run(lowered, x, delegates), run(original, x, delegates), atol=1e-5, rtol=0)
    chain = {EXACT: "erf-chain", TANH: "tanh-chain"}
    assert measured(original) == [("GELU", f, True) for f in flavours]
    assert measured(lowered) == [(chain[f], f, True) for f in flavours]
    assert [s.claimed for s in find_tflite_sites(model)] == list(flavours)
    assert find_tflite_relu_sites(model) == []  # the erf units' RELUs are no ReLU sites
    assert io_names(lowered) == io_names(original)
    stored = model.metadata_text(MIN_RUNTIME_VERSION_KEY)
    if parse_tflite(original).metadata_text(MIN_RUNTIME_VERSION_KEY) is not None:
        assert stored == min_runtime_version_for(used_ops(model)) and stored != "2.9.0"


@pytest.fixture(scope="module")
def converted():
    return mbt.faithful_conversion


def inputs(shape=(64, 16), scale=3.0) -> np.ndarray:
    return (np.random.default_rng(0).standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("builder", list(SOURCES))
def test_keras_conversions_lose_gelu_and_keep_flavour(converted, builder):
    original = converted(builder)
    lowered = lower_gelu_ops(original)
    check_lowered(original, lowered, SOURCES[builder], inputs())
    if SOURCES[builder][0] == EXACT:
        assert {"EXP", "RELU", "SUB"} <= {name for name, _ in used_ops(parse_tflite(lowered))}
        assert parse_tflite(lowered).metadata_text(MIN_RUNTIME_VERSION_KEY) == "1.9.0"
    else:
        assert "POW" not in {name for name, _ in used_ops(parse_tflite(lowered))}
        assert parse_tflite(lowered).metadata_text(MIN_RUNTIME_VERSION_KEY) == "1.14.0"


def test_gelu_without_options_is_lowered_as_exact(converted):
    original = mbt.set_gelu_flag(None)(converted("functional_ops"))  # no table reads as exact
    lowered = lower_gelu_ops(original)
    check_lowered(original, lowered, (EXACT,), inputs())


def test_sites_are_in_graph_order_with_their_input_and_output(converted):
    original = converted("two_gelu_exact")
    before, after = find_tflite_sites(parse_tflite(original)), find_tflite_sites(parse_tflite(lower_gelu_ops(original)))
    assert [(s.input, s.output) for s in after] == [(s.input, s.output) for s in before]
    assert [s.op for s in tflite_activation_sites(parse_tflite(lower_gelu_ops(original)))] == ["erf-chain"] * 2
    assert all("erf written out" in s.note for s in after)


def test_lowering_is_deterministic_and_idempotent(converted):
    original = converted("two_gelu_exact")
    lowered = lower_gelu_ops(original)
    assert lower_gelu_ops(original) == lowered
    assert lower_gelu_ops(lowered) == lowered  # nothing left to lower: the bytes come back


def test_a_quantized_gelu_is_refused(converted):
    s = schema()
    model = s.ModelT.InitFromObj(s.Model.GetRootAs(converted("functional_activation"), 0))
    sg = model.subgraphs[0]
    gelu = next(op for op in sg.operators if model.operatorCodes[op.opcodeIndex].builtinCode == 150)
    sg.tensors[gelu.inputs[0]].type = 9  # INT8
    with pytest.raises(ValueError, match="not float32"):
        lower_gelu_ops(mbt._pack(model))


def test_litert_torch_tanh_gelu(tmp_path):
    import litert_torch

    from fixtures.models import torch_models

    model, (x,) = torch_models.mlp_tanh()
    path = tmp_path / "mlp_tanh.tflite"
    litert_torch.convert(model, (x,)).export(str(path))
    original = path.read_bytes()
    check_lowered(original, lower_gelu_ops(original), (TANH,), (x.numpy() * 2).astype(np.float32))


@pytest.mark.slow
@pytest.mark.parametrize("builder", ["functional_activation", "functional_ops"])
def test_tflite_runtime_2_7_runs_what_it_refused(converted, builder, tmp_path):
    """The point of lowering: tflite-runtime 2.7 refuses GELU (opcode 150) and runs the result."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "compat"))
    from runtime_venvs import TFLITE_2_7, Unavailable, run_model, runtime_venv

    from tests.conftest import tool_missing

    try:
        venv = runtime_venv(TFLITE_2_7)
    except Unavailable as exc:
        tool_missing(f"tflite-runtime 2.7 cannot be had here: {exc}")
    original, lowered = tmp_path / "original.tflite", tmp_path / "lowered.tflite"
    original.write_bytes(converted(builder))
    lowered.write_bytes(lower_gelu_ops(converted(builder)))
    x = inputs((4, 16), 1.5)
    refused = run_model(venv, "tflite", original, [x])
    assert not refused.ok and "builtin_code out of range: 150" in refused.error
    result = run_model(venv, "tflite", lowered, [x])
    assert result.ok, str(result)
    np.testing.assert_allclose(result.outputs[0], run(converted(builder), x, False), atol=1e-5, rtol=0)
