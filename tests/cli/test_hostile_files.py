"""Artifacts nobody checked: external data must stay inside the model's folder and be plain data,
decided before anything reads, hashes, loads or deletes it, on every command."""

import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fixtures.specs import torch_model


def _model_with_external_weight(folder, location, name="m.onnx", write_data=True):
    """A MatMul model whose 16x4 float weight lives in external data at `location`."""
    folder.mkdir(parents=True, exist_ok=True)
    weight = numpy_helper.from_array(np.ones((16, 4), np.float32), "w")
    if write_data:
        (folder / "m.onnx.data").write_bytes(weight.raw_data)
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(16 * 4 * 4))):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])], initializer=[weight])
    path = folder / name
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim.bin"
    path.write_bytes(b"\0" * 4096)
    return path


def _hostile_locations(tmp_path, victim):
    link = tmp_path / "dist" / "link.data"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim)
    return {"absolute": str(victim), "climbing": "../victim.bin", "symlink-out": "link.data"}


@pytest.mark.parametrize("kind", ["absolute", "climbing", "symlink-out"])
def test_failing_export_does_not_delete_what_a_stale_release_names(cli, tmp_path, victim, kind):
    location = _hostile_locations(tmp_path, victim)[kind]
    _model_with_external_weight(tmp_path / "dist", location, write_data=False)
    # sign_branch really exports and fails (exit 1): the stale release at --out is removed.
    result = cli("export", torch_model("sign_branch"), "--to", "onnx", "--opset", "17", "--out", "dist/m.onnx")
    assert result.returncode == 1, result.stderr
    assert victim.read_bytes() == b"\0" * 4096
    assert not (tmp_path / "dist" / "m.onnx").exists()


@pytest.mark.parametrize("kind", ["absolute", "climbing", "symlink-out"])
@pytest.mark.parametrize("command", ["inspect", "check", "verify"])
def test_external_data_outside_the_folder_is_refused(cli, tmp_path, victim, kind, command):
    location = _hostile_locations(tmp_path, victim)[kind]
    _model_with_external_weight(tmp_path / "dist", location, write_data=False)
    extra = {"inspect": [], "check": ["--target", "ort-1.32", "--report", "r.json"],
             "verify": ["--source", torch_model("mlp_exact"), "--report", "r.json"]}[command]
    result = cli(command, "dist/m.onnx", *extra)
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("exportgate: error")]
    assert len(errors) == 1 and "external data" in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    if command != "inspect":
        report = json.loads((tmp_path / "r.json").read_text())
        assert report["exit_code"] == 2 and report["verdict"] != "pass"
        assert str(victim) not in json.dumps(report.get("artifact") or {})  # never hashed


@pytest.mark.parametrize("command", ["inspect", "check", "verify"])
@pytest.mark.parametrize("kind", ["dev-zero", "link-to-dev-zero", "fifo"])
def test_data_that_is_not_a_regular_file_is_refused_at_once(cli, tmp_path, command, kind):
    folder = tmp_path / "dist"
    folder.mkdir()
    if kind == "dev-zero":
        location = "/dev/zero"
    elif kind == "link-to-dev-zero":
        (folder / "z.data").symlink_to("/dev/zero")
        location = "z.data"
    else:
        os.mkfifo(folder / "f.data")
        location = "f.data"
    _model_with_external_weight(folder, location, write_data=False)
    extra = {"inspect": [], "check": ["--target", "ort-1.32"], "verify": ["--source", torch_model("mlp_exact")]}
    result = cli(command, "dist/m.onnx", *extra[command], timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "external data" in result.stderr


def test_data_shorter_than_its_tensors_is_refused(cli, tmp_path):
    path = _model_with_external_weight(tmp_path / "dist", "m.onnx.data")
    (path.parent / "m.onnx.data").write_bytes(b"\0" * 100)
    result = cli("check", "dist/m.onnx", "--target", "ort-1.32")
    assert result.returncode == 2
    assert "needs bytes up to 256, the file has 100" in result.stderr


def test_external_data_inside_the_folder_checks_and_inspects(cli, tmp_path):
    _model_with_external_weight(tmp_path / "dist", "m.onnx.data")
    check = cli("check", "dist/m.onnx", "--target", "ort-1.32", "--report", "r.json")
    assert check.returncode == 0, check.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert [os.path.basename(d["path"]) for d in report["artifact"]["data_files"]] == ["m.onnx.data"]
    assert cli("inspect", "dist/m.onnx").returncode == 0


def _crafted_pt2(folder, marker):
    """A real .pt2 whose first weight is a pickle that creates `marker` when unpickled."""
    import pickle
    import zipfile

    import torch

    model = torch.nn.Linear(4, 2).eval()
    legit = folder / "legit.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(1, 4),)), legit)

    class Payload:
        def __reduce__(self):
            return (eval, (f"__import__('pathlib').Path({str(marker)!r}).touch() or __import__('torch').zeros(2, 4)",))

    crafted = folder / "crafted.pt2"
    with zipfile.ZipFile(legit) as src, zipfile.ZipFile(crafted, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("data/weights/weight_0"):
                data = pickle.dumps(Payload())
            if item.filename.endswith("model_weights_config.json"):
                config = json.loads(data)
                config["config"]["weight"]["use_pickle"] = True
                data = json.dumps(config).encode()
            dst.writestr(item, data)
    return crafted


@pytest.mark.parametrize("command", ["export", "verify"])
def test_a_pt2_is_not_unpickled_without_trust_source(cli, tmp_path, command):
    marker = tmp_path / "code-ran"
    crafted = _crafted_pt2(tmp_path, marker)
    args = {"export": ["export", crafted, "--to", "onnx", "--out", "m.onnx"],
            "verify": ["verify", _model_with_external_weight(tmp_path / "a", "m.onnx.data"), "--source", crafted]}
    result = cli(*args[command])
    assert result.returncode == 2, result.stderr
    assert "--trust-source" in result.stderr.splitlines()[-1]
    assert not marker.exists()
    # The file really is hostile: trusted, loading it runs its payload.
    cli(*args[command], "--trust-source")
    assert marker.exists()


def _keras_with_lambda(folder, marker):
    """A .keras file whose Lambda layer writes `marker` when it runs."""
    from exporter.frameworks.keras_framework import prepare_keras_environment

    prepare_keras_environment()
    import keras

    inputs = keras.Input((4,), batch_size=2, name="x")
    payload = eval(f"lambda t: t + 0 * __import__('pathlib').Path({str(marker)!r}).write_text('ran')")
    hostile = keras.layers.Lambda(payload, output_shape=(2,), name="payload")
    path = folder / "model.keras"
    keras.Model(inputs, hostile(keras.layers.Dense(2)(inputs))).save(path)
    marker.unlink(missing_ok=True)  # building the model ran it once, here
    return path


def test_a_keras_file_with_a_lambda_is_not_loaded_without_trust_source(cli, tmp_path):
    """Keras stores a Lambda's function as Python bytecode: the file is refused before it loads,
    naming the layer; trusted, Keras loads it without safe_mode and its code runs."""
    marker = tmp_path / "code-ran"
    crafted = _keras_with_lambda(tmp_path, marker)
    result = cli("export", crafted, "--to", "onnx", "--out", "m.onnx")
    assert result.returncode == 2, result.stderr
    last = result.stderr.splitlines()[-1]
    assert "Lambda layer payload" in last and last.endswith("pass --trust-source to load a file you trust")
    assert not marker.exists()
    from exporter.frameworks.keras_framework import KerasFramework
    from verifiers.errors import BadInput

    with pytest.raises(BadInput, match="not a loadable Keras model"):  # and below the scan, Keras' safe_mode
        KerasFramework().load_file(crafted)
    assert not marker.exists()
    cli("export", crafted, "--to", "onnx", "--out", "m.onnx", "--trust-source")
    assert marker.exists()
