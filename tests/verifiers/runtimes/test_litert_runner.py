"""The ai-edge-litert runner: two interpreters, names through the signature, malformed files refused."""

import sys

import numpy as np
import pytest

from exporter.frameworks import FRAMEWORKS
from fixtures.children import run_child
from exporter.routes import ExportRequest, route_for
from verifiers.runtimes import InvalidArtifact, runtime_for
from verifiers.runtimes.litert_runner import LiteRtRunner

GRID = np.linspace(-10, 10, 2001, dtype=np.float32).reshape(1, -1)


@pytest.fixture(scope="module")
def gelu_model(tmp_path_factory):
    """A Keras model that is one exact GELU: x (1x2001) -> y."""
    import keras

    x = keras.Input((GRID.shape[1],), name="x")
    model = keras.Model(x, keras.layers.Activation("gelu", name="y")(x))
    source = FRAMEWORKS["keras"].make_source("gelu", model, None, [], list)
    path = tmp_path_factory.mktemp("litert") / "gelu.tflite"
    route_for("keras", "tflite").export(source, ExportRequest("tflite", output_names=["y"]), path,
                                       progress=lambda m: None)
    return path


@pytest.fixture(scope="module")
def unsigned_model(gelu_model):
    """The same model with its SignatureDefs stripped: inputs and outputs by tensor order."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromObj(schema.Model.GetRootAs(gelu_model.read_bytes(), 0))
    model.signatureDefs = []
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    path = gelu_model.with_name("unsigned.tflite")
    path.write_bytes(bytes(builder.Output()))
    return path


def test_registered_for_tflite():
    assert runtime_for("tflite") is LiteRtRunner
    assert LiteRtRunner.runtime == "ai-edge-litert"


def test_signature_names_shapes_and_dtypes(gelu_model):
    runner = LiteRtRunner(gelu_model)
    assert runner.signature == "serving_default"
    assert [(i.name, i.dtype) for i in runner.inputs] == [("x", "float32")]
    assert [(o.name, o.dtype) for o in runner.outputs] == [("y", "float32")]
    assert runner.inputs[0].shape[1] == GRID.shape[1]


def plain_interpreter_output(path, resolver_type, x: np.ndarray) -> np.ndarray:
    """What ai_edge_litert's own Interpreter with the given op resolver computes for the one-input model."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path), experimental_op_resolver_type=resolver_type)
    index = interpreter.get_input_details()[0]["index"]
    interpreter.resize_tensor_input(index, list(x.shape))
    interpreter.allocate_tensors()
    interpreter.set_tensor(index, x)
    interpreter.invoke()
    return np.array(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]))


def test_run_all_reports_both_interpreters(gelu_model):
    """Each variant is what its op resolver computes, bit for bit, however the XNNPACK kernel treats
    the tail (it flushes x < -6 to 0 in ai-edge-litert 2.3; the builtin kernel does not)."""
    from ai_edge_litert.interpreter import OpResolverType

    runner = LiteRtRunner(gelu_model)
    outputs = runner.run_all({"x": GRID})
    assert set(outputs) == {"xnnpack", "builtin"}
    assert all(len(v) == 1 and v[0].shape == GRID.shape for v in outputs.values())
    np.testing.assert_array_equal(runner.run({"x": GRID})[0], outputs["xnnpack"][0])
    resolvers = {"xnnpack": OpResolverType.AUTO, "builtin": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
    for variant, resolver in resolvers.items():
        np.testing.assert_array_equal(outputs[variant][0], plain_interpreter_output(gelu_model, resolver, GRID),
                                      err_msg=variant)


def test_model_without_signatures_runs_by_order(gelu_model, unsigned_model):
    runner = LiteRtRunner(unsigned_model)
    assert runner.signature is None
    assert len(runner.inputs) == len(runner.outputs) == 1
    signed = LiteRtRunner(gelu_model).run_all({"x": GRID})
    unsigned = runner.run_all({runner.inputs[0].name: GRID})
    for key in ("xnnpack", "builtin"):
        np.testing.assert_array_equal(unsigned[key][0], signed[key][0])


def test_signature_runner_resizes_the_batch(gelu_model):
    runner = LiteRtRunner(gelu_model)
    batch = np.repeat(GRID, 3, axis=0)
    for outputs in runner.run_all({"x": batch}).values():
        assert outputs[0].shape == batch.shape


def _corruptions(data: bytes) -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    return {
        "empty": b"",
        "tiny": data[:12],
        "garbage": rng.integers(0, 256, 4000, dtype=np.uint8).tobytes(),
        "onnx-like": b"\x08\x07\x12\x07pytorch" + bytes(200),
        "no-identifier": data[:4] + b"XXXX" + data[8:],
        "truncated-10%": data[: len(data) // 10],
        "truncated-50%": data[: len(data) // 2],
        "truncated-90%": data[: len(data) * 9 // 10],
        "root-past-end": (len(data) + 100).to_bytes(4, "little") + data[4:],
        "identifier-then-garbage": data[:8] + rng.integers(0, 256, len(data) - 8, dtype=np.uint8).tobytes(),
    }


@pytest.mark.parametrize("case", list(_corruptions(b"\0" * 64)))
def test_malformed_files_are_one_line_invalid_artifacts(gelu_model, tmp_path, case):
    path = tmp_path / f"{case}.tflite"
    path.write_bytes(_corruptions(gelu_model.read_bytes())[case])
    with pytest.raises(InvalidArtifact) as caught:
        LiteRtRunner(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    assert caught.value.kind == "input"


def test_malformed_files_never_crash_the_process(gelu_model, tmp_path):
    """The interpreter is native code: check in a child process that every corruption is refused."""
    for case, data in _corruptions(gelu_model.read_bytes()).items():
        (tmp_path / f"{case}.tflite").write_bytes(data)
    code = (
        "import sys, pathlib\n"
        "from verifiers.runtimes import InvalidArtifact\n"
        "from verifiers.runtimes.litert_runner import LiteRtRunner\n"
        "for path in sorted(pathlib.Path(sys.argv[1]).glob('*.tflite')):\n"
        "    try:\n"
        "        LiteRtRunner(path)\n"
        "        print('loaded', path.name)\n"
        "    except InvalidArtifact:\n"
        "        print('refused', path.name)\n"
    )
    done = run_child([sys.executable, "-c", code, tmp_path], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("refused") == len(_corruptions(b"\0" * 64)), done.stdout


def test_missing_file_is_invalid_artifact(tmp_path):
    with pytest.raises(InvalidArtifact, match="absent.tflite"):
        LiteRtRunner(tmp_path / "absent.tflite")
