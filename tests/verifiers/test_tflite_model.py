"""Reading .tflite files without TensorFlow: describe, min_runtime_version, corrupt files."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from fixtures.children import run_child
from verifiers.errors import BadInput
from fixtures import make_broken_tflite as mbt
from verifiers import tflite_model
from verifiers.tflite_model import (
    describe,
    load_tflite,
    parse_tflite,
)
from verifiers.tflite_runtime_versions import min_runtime_version_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Keras conversions: exact GELU, two GELUs and the unfused tanh chain, as files."""
    folder = tmp_path_factory.mktemp("tflite_model")
    out = {}
    for name in ("keras_exact_faithful", "two_gelu_faithful", "tanh_chain_faithful"):
        out[name] = mbt.build_fixture(name, folder).path
    return out


def _without_metadata(content: bytes, name: str) -> bytes:
    model = mbt._unpack(content)
    model.metadata = [m for m in model.metadata if m.name.decode() != name]
    return mbt._pack(model)


def test_describe_keras_gelu(files):
    info = describe(files["keras_exact_faithful"])
    assert info["format"] == "tflite" and info["schema_version"] == 3
    assert {"op": "GELU", "version": 1} in info["ops"]
    assert info["op_counts"] == {"FULLY_CONNECTED": 2, "GELU": 1}
    assert info["subgraphs"][0]["operators"] == 3
    assert info["signatures"][0]["key"] == "serving_default"
    assert info["inputs"] == [{"name": "features", "shape": ["?", 16], "dtype": "float32"}]
    assert info["outputs"][0]["shape"] == ["?", 4] and info["outputs"][0]["dtype"] == "float32"
    assert info["min_runtime_version"] == "2.9.0"
    assert info["min_runtime_version_source"] == "metadata"
    assert info["min_runtime_version_computed"] == "2.9.0"
    assert "min_runtime_version" in info["metadata"] and info["custom_ops"] == []


def test_min_runtime_version_computed_when_metadata_is_stripped(files, tmp_path):
    path = tmp_path / "stripped.tflite"
    path.write_bytes(_without_metadata(files["two_gelu_faithful"].read_bytes(), "min_runtime_version"))
    info = describe(path)
    assert "min_runtime_version" not in info["metadata"]
    assert info["min_runtime_version"] == "2.9.0" and info["min_runtime_version_source"] == "computed"


def test_computed_version_agrees_with_the_converter(files):
    """The TF converter's own metadata equals what the transcribed table computes."""
    for path in files.values():
        info = describe(path)
        assert info["min_runtime_version_computed"] == info["min_runtime_version"], path.name
    assert describe(files["tanh_chain_faithful"])["min_runtime_version"] == "1.14.0"  # MUL, ADD, TANH v1


def test_runtime_version_table():
    assert min_runtime_version_for([("GELU", 1)]) == "2.9.0"
    assert min_runtime_version_for([("GELU", 2)]) == "2.9.0"
    assert min_runtime_version_for([("SIGN", 1), ("GELU", 1)]) == "2.11.0"
    assert min_runtime_version_for([("ADD", 1), ("FULLY_CONNECTED", 5), ("MUL", 1)]) == "2.0.0"
    assert min_runtime_version_for([("RELU", 1), ("TANH", 1), ("LOGISTIC", 1)]) == "1.14.0"
    assert min_runtime_version_for([("FULLY_CONNECTED", 10)]) == "2.11.0"  # 2.10.0 < 2.11.0 numerically
    assert min_runtime_version_for([("STABLEHLO_ADD", 1), ("BROADCAST_TO", 1)]) is None


def test_opcode_is_max_of_builtin_and_deprecated_code(files):
    model = load_tflite(files["keras_exact_faithful"])
    gelu = [oc for oc in model.opcodes if oc.name == "GELU"]
    assert gelu and gelu[0].code == 150 and gelu[0].version == 1


def test_describe_reads_the_structure_not_the_weights(files, tmp_path, monkeypatch):
    """describe is cheap because it reads the flatbuffer's tables only: a weight buffer is an
    (offset, length) it never decodes. With every weight byte scrambled it says the same, and it
    reads no buffer but the metadata's. (How fast that is belongs in bench/.)"""
    path = files["keras_exact_faithful"]
    model = load_tflite(path)
    metadata = set(model.metadata.values())
    weights = {t.buffer for sg in model.subgraphs for t in sg.tensors if t.buffer and model.buffers[t.buffer][1]}
    assert weights and not weights & metadata
    content = bytearray(path.read_bytes())
    for index in weights:
        start, length = model.buffers[index]
        content[start:start + length] = bytes(~b & 0xFF for b in content[start:start + length])
    scrambled = tmp_path / "scrambled.tflite"
    scrambled.write_bytes(bytes(content))
    expected = {**describe(path), "path": str(scrambled)}

    read = []
    buffer_bytes = tflite_model.TFLiteModel.buffer_bytes
    monkeypatch.setattr(tflite_model.TFLiteModel, "buffer_bytes", lambda self, i: read.append(i) or buffer_bytes(self, i))
    monkeypatch.setattr(tflite_model.TFLiteModel, "constant", lambda *args, **kw: pytest.fail("describe decoded a tensor"))
    assert describe(scrambled) == expected
    assert read and set(read) <= metadata


def test_describe_builds_no_interpreter_and_loads_no_native_code(files):
    """Nor does describe hand the file to LiteRT: no interpreter, no extension module loads (in a
    fresh interpreter, so what other tests imported does not count)."""
    code = textwrap.dedent(f"""
        import sys
        def native():
            return {{name for name, module in list(sys.modules.items())
                     if (getattr(module, "__file__", None) or "").endswith((".so", ".pyd"))}}
        from verifiers.tflite_model import describe
        before = native()
        info = describe({str(files['two_gelu_faithful'])!r})
        assert info["op_counts"]["GELU"] == 2, info["op_counts"]
        print(sorted(native() - before))
    """)
    result = run_child([sys.executable, "-c", code], cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("content", [b"", b"TFL3", b"\x08\x07\x12\x04onnx" * 10, b"hello world, not a model",
                                     os.urandom(4096)])
def test_not_tflite_is_bad_input(content, tmp_path):
    path = tmp_path / "x.tflite"
    path.write_bytes(content)
    with pytest.raises(BadInput, match="not a TFLite model|corrupt"):
        load_tflite(path)


def test_missing_file_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="no such file"):
        describe(tmp_path / "absent.tflite")


def test_truncated_files_are_bad_input(files):
    content = files["two_gelu_faithful"].read_bytes()
    for length in (0, 4, 7, 8, 12, 16, 64, 100, len(content) // 4, len(content) // 2, len(content) - 64):
        with pytest.raises(BadInput) as info:
            parse_tflite(content[:length], f"cut{length}")
        assert "\n" not in str(info.value)


def test_bit_flipped_subgraph_length_is_bad_input(files):
    content = mbt.flip_subgraphs_length_bit()(files["keras_exact_faithful"].read_bytes())
    with pytest.raises(BadInput, match="runs past the end of the file"):
        parse_tflite(content)


_FUZZ = textwrap.dedent("""
    import random, sys
    from verifiers.errors import BadInput
    from verifiers.tflite_model import parse_tflite, describe
    from verifiers.formats.tflite.gelu_inventory import tflite_inventory
    content = open(sys.argv[1], "rb").read()
    loaded = bad = 0
    for seed in range(int(sys.argv[2])):
        rng = random.Random(seed)
        data = bytearray(content)
        for _ in range(rng.choice([1, 1, 2, 4, 16])):
            k = rng.randrange(len(data) * 8)
            data[k // 8] ^= 1 << (k % 8)
        if seed % 7 == 0:
            data = data[: rng.randrange(len(data))]
        try:
            model = parse_tflite(bytes(data))
            tflite_inventory(model)
            loaded += 1
        except BadInput as exc:
            assert "\\n" not in str(exc)
            bad += 1
    print(loaded, bad)
""")


def test_random_bit_flips_never_crash_the_process(files):
    """Hundreds of corrupted copies, read, searched for sites and probed in a child process:
    each loads or raises BadInput, and the child exits normally (no segfault, no hang)."""
    result = run_child([sys.executable, "-c", _FUZZ, files["two_gelu_faithful"], "400"], cwd=REPO, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded, bad = map(int, result.stdout.split())
    assert loaded + bad == 400 and bad > 50 and loaded > 50


def test_reading_imports_neither_tensorflow_nor_torch(files):
    code = textwrap.dedent(f"""
        import sys
        from verifiers.tflite_model import describe
        from verifiers.formats.tflite.gelu_inventory import tflite_inventory
        describe({str(files['two_gelu_faithful'])!r})
        assert [e.flavour for e in tflite_inventory({str(files['two_gelu_faithful'])!r})] == ["exact", "exact"]
        heavy = sorted(m for m in ("tensorflow", "torch", "keras") if m in sys.modules)
        print(heavy)
    """)
    result = run_child([sys.executable, "-c", code], cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


def test_schema_module_is_ai_edge_litert():
    assert tflite_model.schema().__name__ == "ai_edge_litert.schema_py_generated"
