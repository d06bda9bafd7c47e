"""opset_matrix.yaml: the shipped matrix validates, user files merge, and the claims for the
installed onnxruntime hold when checked against the real runtime."""

from __future__ import annotations

import copy
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from onnx import TensorProto, helper

from verifiers.errors import BadInput
from verifiers.target_matrix import get_target, load_targets
from verifiers.targets import Target

# The facts the runtime tests below check; the matching ORT entry records exactly these.
CONFIRMED_BY_TESTS = {"max_opset", "gelu.gelu_op", "gelu.erf", "gelu.contrib_gelu", "op_gaps", "float16"}
INSTALLED = f"ort-{'.'.join(ort.__version__.split('.')[:2])}"

VALID_ENTRY = {
    "format": "onnx",
    "runtime": "onnxruntime",
    "version": "9.9",
    "max_opset": 30,
    "gelu": {"gelu_op": True, "erf": True, "contrib_gelu": None},
    "op_gaps": [],
    "sources": [
        {"fact": "max_opset", "source": "release notes v9.9", "quote": "opset 30"},
        {"fact": "gelu.gelu_op", "source": "release notes v9.9", "quote": "Gelu"},
        {"fact": "gelu.erf", "source": "release notes v9.9", "quote": "Erf"},
    ],
    "confirmed_by_test": [],
}


def write_matrix(tmp_path, targets: dict, name: str = "my.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"schema": 1, "targets": targets}), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def shipped() -> dict[str, Target]:
    return load_targets()


# ----------------------------------------------------------------- the shipped matrix


def test_shipped_matrix_loads_and_validates(shipped):
    assert {"ort-1.14", "ort-1.17", "ort-1.22", "ort-1.32", "tensorrt-10.15", "tflite-2.9"} <= set(shipped)
    for name, target in shipped.items():
        assert target.name == name
        assert target.fact_keys() <= {s.fact for s in target.sources}


def test_shipped_matrix_key_facts(shipped):
    assert [shipped[f"ort-{v}"].max_opset for v in ("1.14", "1.16", "1.17", "1.18", "1.22")] == [18, 19, 20, 21, 22]
    assert shipped["ort-1.16"].gelu["gelu_op"] is False and shipped["ort-1.17"].gelu["gelu_op"] is True
    assert shipped["tflite-2.7"].gelu["builtin"] is False and shipped["tflite-2.9"].gelu["builtin"] is True
    assert shipped["tflite-2.9"].gelu["sign_op"] is False and shipped["tflite-2.11"].gelu["sign_op"] is True


def test_the_installed_runtime_claims_what_these_tests_confirm(installed):
    # Older runtimes' confirmations are kept in step by tests/compat/test_old_runtimes.py.
    assert set(installed.confirmed_by_test) == CONFIRMED_BY_TESTS


# ------------------------------------------------------------- user files and errors


def test_user_file_adds_and_overrides(tmp_path, shipped):
    override = copy.deepcopy(VALID_ENTRY)
    override["version"] = "1.32"
    override["max_opset"] = 27
    path = write_matrix(tmp_path, {"ort-9.9": VALID_ENTRY, "ort-1.32": override})

    merged = load_targets(path)

    assert merged["ort-9.9"].max_opset == 30
    assert merged["ort-1.32"].max_opset == 27
    assert merged["ort-1.32"].confirmed_by_test == ()  # the whole entry is replaced
    assert set(merged) == set(shipped) | {"ort-9.9"}


def _broken(**changes):
    entry = copy.deepcopy(VALID_ENTRY)
    for key, value in changes.items():
        if key == "gelu_op":
            entry["gelu"]["gelu_op"] = value
        elif key == "drop_source":
            entry["sources"] = [s for s in entry["sources"] if s["fact"] != value]
        else:
            entry[key] = value
    return entry


@pytest.mark.parametrize(
    ("entry", "field", "problem"),
    [
        (_broken(max_opset="twenty"), "max_opset", "must be an integer"),
        (_broken(max_opset=True), "max_opset", "must be an integer"),
        (_broken(format="coreml"), "format", "must be one of onnx, tflite"),
        (_broken(gelu_op="yes"), "gelu.gelu_op", "must be true, false or null"),
        (_broken(drop_source="gelu.erf"), "gelu.erf", "has no entry in 'sources'"),
        (_broken(max_runtime_version="2.9"), "max_runtime_version", "is not a field of onnx targets"),
        (_broken(confirmed_by_test=["gelu.contrib_gelu"]), "confirmed_by_test", "lists 'gelu.contrib_gelu'"),
        (_broken(sources=[{"fact": "max_opset", "source": "x"}]), "sources", "entries must be"),
        (_broken(float16="bfloat16"), "float16", "must be float16 or float32"),
        (_broken(float16="float16"), "float16", "has no entry in 'sources'"),
    ],
)
def test_malformed_user_entry_names_entry_and_field(tmp_path, entry, field, problem):
    path = write_matrix(tmp_path, {"ort-9.9": entry})
    with pytest.raises(BadInput) as err:
        load_targets(path)
    message = str(err.value)
    assert message.startswith(f"my.yaml: target 'ort-9.9': field '{field}' ")
    assert problem in message
    assert "\n" not in message


def test_unreadable_or_unparsable_user_file(tmp_path):
    with pytest.raises(BadInput, match=r"^missing\.yaml: cannot read"):
        load_targets(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("targets: [unclosed\n", encoding="utf-8")
    with pytest.raises(BadInput, match=r"^bad\.yaml: not valid YAML"):
        load_targets(bad)
    no_schema = tmp_path / "old.yaml"
    no_schema.write_text(yaml.safe_dump({"targets": {"ort-9.9": VALID_ENTRY}}), encoding="utf-8")
    with pytest.raises(BadInput, match=r"^old\.yaml: field 'schema' must be 1"):
        load_targets(no_schema)


def test_get_target_lists_close_names(shipped):
    assert get_target("ort-1.17", shipped).max_opset == 20
    with pytest.raises(BadInput, match=r"unknown target 'ort-1.71'; did you mean: .*ort-1\.17"):
        get_target("ort-1.71", shipped)
    with pytest.raises(BadInput, match=r"unknown target 'zzz'; known targets: .*ort-1\.14"):
        get_target("zzz", shipped)


# ------------------------------------------- claims checked against the installed runtime


@pytest.fixture
def installed(shipped, monkeypatch) -> Target:
    if INSTALLED not in shipped:
        pytest.fail(f"opset_matrix.yaml has no entry for the installed onnxruntime {ort.__version__}: add "
                    f"target {INSTALLED!r} (the tests below check its claims against this runtime and its "
                    f"confirmed_by_test lists {', '.join(sorted(CONFIRMED_BY_TESTS))})", pytrace=False)
    # With this set to 0, ORT would also load opsets it calls "under development".
    monkeypatch.delenv("ALLOW_RELEASED_ONNX_OPSET_ONLY", raising=False)
    return shipped[INSTALLED]


def one_node_model(op: str, opset: int, domain: str = "", dtype=TensorProto.FLOAT, n_inputs=1, **attrs):
    names = ["x", "b"][:n_inputs]
    inputs = [helper.make_tensor_value_info(n, dtype, [4]) for n in names]
    output = helper.make_tensor_value_info("y", dtype, [4])
    node = helper.make_node(op, names, ["y"], domain=domain, **attrs)
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(helper.make_graph([node], "g", inputs, [output]), opset_imports=imports)
    model.ir_version = 10  # an IR every ORT release with opset 20+ reads, whatever onnx writes by default
    return model


def run(model: onnx.ModelProto, **feeds) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


X = np.array([-5.0, -1.0, 0.5, 2.0], dtype=np.float32)
ERF = np.array([math.erf(v) for v in X / math.sqrt(2)], dtype=np.float32)
EXACT = 0.5 * X * (1 + ERF)
TANH = 0.5 * X * (1 + np.tanh(math.sqrt(2 / math.pi) * (X + 0.044715 * X**3)))
QUICK = X / (1 + np.exp(-1.702 * X))


def test_ort_max_opset_matches_installed_runtime(installed):
    run(one_node_model("Relu", installed.max_opset), x=X)
    with pytest.raises(
        Exception, match=f"Current official support for domain ai.onnx is till opset {installed.max_opset}"
    ):
        run(one_node_model("Relu", installed.max_opset + 1), x=X)


def test_ort_onnx_gelu_runs(installed):
    assert installed.gelu["gelu_op"] is True
    np.testing.assert_allclose(run(one_node_model("Gelu", 20, approximate="none"), x=X), EXACT, atol=1e-6)
    np.testing.assert_allclose(run(one_node_model("Gelu", 20, approximate="tanh"), x=X), TANH, atol=1e-6)


def test_ort_erf_runs(installed):
    assert installed.gelu["erf"] is True
    np.testing.assert_allclose(run(one_node_model("Erf", 13), x=X / np.float32(math.sqrt(2))), ERF, atol=1e-6)


def test_ort_contrib_gelu_ops_run(installed):
    assert installed.gelu["contrib_gelu"] is True
    ms = "com.microsoft"
    np.testing.assert_allclose(run(one_node_model("Gelu", 17, ms), x=X), EXACT, atol=1e-6)
    np.testing.assert_allclose(run(one_node_model("FastGelu", 17, ms), x=X), TANH, atol=1e-6)
    np.testing.assert_allclose(run(one_node_model("QuickGelu", 17, ms), x=X), QUICK, atol=1e-6)
    bias = np.full(4, 0.25, dtype=np.float32)
    bias_exact = 0.5 * (X + bias) * (1 + np.array([math.erf(v) for v in (X + bias) / math.sqrt(2)]))
    np.testing.assert_allclose(run(one_node_model("BiasGelu", 17, ms, n_inputs=2), x=X, b=bias), bias_exact, atol=1e-6)


def test_ort_erf_has_no_float64_kernel(installed):
    assert [gap.op for gap in installed.op_gaps] == ["Erf"]
    with pytest.raises(Exception, match=r"NOT_IMPLEMENTED.*Erf"):
        run(one_node_model("Erf", 13, dtype=TensorProto.DOUBLE), x=X.astype(np.float64))


def test_ort_computes_float16_ops_in_float32(installed):
    """x*x then /4 on float16 x = 300: 90000 is past float16's 65504, so float16 arithmetic gives
    Inf; the CPU provider casts both ops up to float32 and returns 22500 (rounded to float16 as
    the output is written)."""
    assert installed.float16 == "float32"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1])
    four = helper.make_tensor("four", TensorProto.FLOAT16, [1], np.array([4], np.float16))
    graph = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["square"]),
                               helper.make_node("Div", ["square", "four"], ["y"])], "g", [x], [y], [four])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    three_hundred = np.array([300], np.float16)
    with np.errstate(over="ignore"):
        assert np.isinf(three_hundred * three_hundred / np.float16(4))  # float16 arithmetic
    assert run(model, x=three_hundred).tolist() == [np.float16(22500)]
