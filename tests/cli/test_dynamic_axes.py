"""Dynamic axes: every dynamic axis is verified at its export size and at 1, an odd prime and
2 x export + 3 (docs/concepts.md "Dynamic axes: every size the artifact accepts").

Models that bake an export size into the artifact (fixtures/models/sized_models.py and the
transformers wrappers of fixtures/models/sized_transformers.py) must fail naming the axis and the
size, with the hints that say why; faithful ones (and third-party models: transformers, Keras,
keras.applications) must pass at every size. The CLI runs where its exit code, its one-line
messages or its files are the point; the rest calls exporter.api in-process (the report is the
one the CLI prints from). Real frameworks and runtimes throughout; random weights, seeded.
"""

import ast
import json
import re
from pathlib import Path

import onnx
import pytest
from junitparser import Failure, JUnitXml

from exporter import api
from fixtures.models import sized_models

# The tests that export with plain torch.onnx themselves (as another tool would) trace int() and if.
pytestmark = pytest.mark.filterwarnings("ignore:Converting a tensor to a Python")

SIZED = Path(sized_models.__file__).resolve()
SIZED_TRANSFORMERS = SIZED.parent / "sized_transformers.py"
HF = SIZED.parent / "hf_models.py"
CORPUS = SIZED.parent / "corpus_transformers.py"

BERT_AXES = ["input_ids:0", "input_ids:1", "attention_mask:0", "attention_mask:1"]

# (builder, --dynamic, the axis's export size, sizes tried)
BROKEN = [
    ("baked_batch_reshape", "x:0", 2, [1, 2, 3, 7]),
    ("numpy_causal_mask", "x:1", 6, [1, 3, 6, 15]),
    ("mean_by_traced_length", "x:1", 6, [1, 3, 6, 15]),
]

# What compare_at_sizes writes for a difference at another size (docs/concepts.md's example).
AT_SIZE = re.compile(r"^output \S+: max abs err [0-9.e+-]+ at x axis 1 = 1 \(export size 6\)$")


def sized(name: str) -> str:
    return f"{SIZED}:{name}"


def int_call_line(path: Path, function: str) -> int:
    """The line of the `int(...)` call in the builder `function` of `path` (in the forward() it
    defines): where the tracer turns a size into a Python number."""
    tree = ast.parse(path.read_text())
    [func] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function]
    [call] = [n for n in ast.walk(func) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "int"]
    return call.lineno


def entry(report, input_name: str, axis: int) -> dict:
    [found] = [d for d in _dynamic(report) if d["input"] == input_name and d["axis"] == axis]
    return found


def _dynamic(report) -> list[dict]:
    return report["dynamic"] if isinstance(report, dict) else report.dynamic


def assert_held(report, input_name: str, axis: int, sizes: list[int]) -> dict:
    """The axis passed, and was run (and measured) at each of `sizes`."""
    found = entry(report, input_name, axis)
    assert found["status"] == "pass", found
    assert found["sizes"] == sizes
    assert sorted(map(int, found["max_abs_err"])) == sizes, found
    assert max(found["max_abs_err"].values()) < 1e-3, found
    return found


def passed(report) -> None:
    assert report.exit_code == 0, report.summary_lines()


def dim_params(path: Path) -> dict[str, list[str]]:
    """Each ONNX input's dim_param per axis ("" for a fixed dimension)."""
    model = onnx.load(str(path), load_external_data=False)
    return {i.name: [d.dim_param for d in i.type.tensor_type.shape.dim] for i in model.graph.input}


def read_junit(path: Path) -> dict:
    [suite] = list(JUnitXml.fromfile(str(path)))
    return {(case.classname, case.name): case for case in suite}


# ---- 1, 2: the broken PyTorch models --------------------------------------------------------------


@pytest.mark.parametrize(("name", "dynamic", "export_size", "sizes"), BROKEN, ids=[row[0] for row in BROKEN])
def test_a_baked_size_fails_the_torchscript_export_naming_axis_and_size(cli, tmp_path, name, dynamic,
                                                                          export_size, sizes):
    axis = int(dynamic.split(":")[1])
    result = cli("export", sized(name), "--to", "onnx", "--opset", "17", "--exporter", "torchscript",
                 "--dynamic", dynamic, "--out", "dist/m.onnx", "--report", "m.json")
    assert result.returncode == 1, result.stderr
    failures = [line.strip() for line in result.stderr.splitlines() if line.startswith("  [numeric]")]
    assert failures and all(f"x axis {axis} = " in line and f"(export size {export_size})" in line
                            for line in failures), result.stderr
    assert not (tmp_path / "dist/m.onnx").exists() and list((tmp_path / "dist").iterdir()) == []

    report = json.loads((tmp_path / "m.json").read_text())
    found = entry(report, "x", axis)
    assert found["status"] == "fail" and found["export_size"] == export_size and found["sizes"] == sizes
    assert report["verdict"] == "fail" and report["rejected_artifact"]
    traced = [h for h in report["dynamic_hints"] if h["kind"] == "traced_number"]
    line = int_call_line(SIZED, name)
    assert [h["location"] for h in traced] == [f"{SIZED}:{line}"], report["dynamic_hints"]
    assert f"hint: {traced[0]['message']}" in result.stderr  # the summary of a run that failed at a size says why
    if name == "baked_batch_reshape":
        [shape] = [h for h in report["dynamic_hints"] if h["kind"] == "constant_shape"]
        assert "[2, -1]" in shape["message"] and "x axis 0" in shape["message"]
    if name == "mean_by_traced_length":
        assert any(AT_SIZE.match(line.removeprefix("[numeric] ")) for line in failures), result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("name", "dynamic", "export_size", "sizes"), BROKEN, ids=[row[0] for row in BROKEN])
def test_a_baked_size_comes_out_static_from_dynamo_exit_4(cli, tmp_path, name, dynamic, export_size, sizes):
    axis = int(dynamic.split(":")[1])
    result = cli("export", sized(name), "--to", "onnx", "--exporter", "dynamo", "--dynamic", dynamic,
                 "--out", "dist/m.onnx", "--report", "m.json")
    assert result.returncode == 4, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("  [target]")]
    assert f"input x axis {axis}" in line and "static in the artifact" in line, result.stderr
    assert not (tmp_path / "dist/m.onnx").exists()
    found = entry(json.loads((tmp_path / "m.json").read_text()), "x", axis)
    assert found["status"] == "fail" and found["sizes"] == [] and "static in the artifact" in found["detail"]


# ---- 3, 4: faithful PyTorch models, ranges --------------------------------------------------------

FAITHFUL = [("flatten_mlp", "input:0", [1, 2, 3, 7]), ("mean_over_length", "x:1", [1, 3, 6, 15])]
EXPORTERS = [("torchscript", 17), pytest.param("dynamo", 18, marks=pytest.mark.slow)]


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS)
@pytest.mark.parametrize(("name", "dynamic", "sizes"), FAITHFUL, ids=[row[0] for row in FAITHFUL])
def test_a_faithful_model_holds_at_every_size_and_stays_dynamic(tmp_path, name, dynamic, sizes, exporter, opset):
    input_name, axis = dynamic.split(":")
    out = tmp_path / "m.onnx"
    report = api.export(sized(name), to="onnx", opset=opset, exporter=exporter, dynamic=[dynamic], out=out)
    passed(report)
    found = assert_held(report, input_name, int(axis), sizes)
    assert found["range"] == [1, None]
    assert [d["input"] for d in report.dynamic] == [input_name]  # no other axis was made dynamic
    assert dim_params(out)[input_name][int(axis)] == found["symbol"] != ""


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS)
def test_a_range_bounds_the_sizes_tried(tmp_path, exporter, opset):
    out = tmp_path / "m.onnx"
    report = api.export(sized("mean_over_length"), to="onnx", opset=opset, exporter=exporter,
                        dynamic=["x:1:4..8"], out=out)
    passed(report)
    found = assert_held(report, "x", 1, [4, 5, 6, 8])
    assert found["range"] == [4, 8]
    assert dim_params(out)["x"][1] == found["symbol"] != ""


# ---- 5: Keras None dimensions ---------------------------------------------------------------------


@pytest.mark.parametrize("to", ["onnx", pytest.param("tflite", marks=pytest.mark.slow)])
def test_a_keras_none_batch_is_dynamic_and_holds(tmp_path, to):
    out = tmp_path / f"m.{to}"
    report = api.export(sized("keras_batch_none"), to=to, opset=17 if to == "onnx" else None, out=out)
    passed(report)
    found = assert_held(report, "x", 0, [1, 2, 3, 7])
    assert found["export_size"] == 2
    assert [d["axis"] for d in api.inspect(out)["inputs"][0]["dynamic_axes"]] == [0]


@pytest.mark.slow
@pytest.mark.parametrize("to", ["onnx", "tflite"])
def test_keras_none_batch_and_length_are_two_symbols_of_distinct_export_sizes(tmp_path, to):
    report = api.export(sized("keras_sequence_none"), to=to, opset=17 if to == "onnx" else None,
                        out=tmp_path / f"m.{to}")
    passed(report)
    batch, length = assert_held(report, "x", 0, [1, 2, 3, 7]), assert_held(report, "x", 1, [1, 3, 5, 9])
    assert batch["symbol"] != length["symbol"]
    assert (batch["export_size"], length["export_size"]) == (2, 3)
    assert [d["axis"] for d in api.inspect(tmp_path / f"m.{to}")["inputs"][0]["dynamic_axes"]] == [0, 1]


@pytest.mark.parametrize("to", ["onnx", pytest.param("tflite", marks=pytest.mark.slow)])
def test_input_fixes_a_keras_none_batch(tmp_path, to):
    out = tmp_path / f"m.{to}"
    report = api.export(sized("keras_batch_none"), to=to, opset=17 if to == "onnx" else None,
                        inputs=["x:4x6x8:float32"], out=out)
    passed(report)
    assert report.dynamic == []
    [tensor] = api.inspect(out)["inputs"]
    assert tensor["shape"][0] == 4 and tensor["dynamic_axes"] == []


# ---- 6, 7: verify of artifacts other tools made ---------------------------------------------------


def torchscript_onnx(path: Path, model, example: tuple, dynamic_axes: dict) -> Path:
    """`model` exported with plain torch.onnx (the TorchScript exporter), as another tool would."""
    import torch

    torch.onnx.export(model, example, str(path), dynamo=False, opset_version=17, input_names=["x"],
                      dynamic_axes=dynamic_axes)
    return path


def test_verify_finds_a_baked_length_in_an_artifact_torch_onnx_made(cli, tmp_path):
    model, example = sized_models.mean_by_traced_length()
    torchscript_onnx(tmp_path / "m.onnx", model, example, {"x": {1: "seq"}})
    result = cli("verify", "m.onnx", "--source", sized("mean_by_traced_length"), "--report", "v.json")
    assert result.returncode == 1, result.stderr
    failures = [line for line in result.stderr.splitlines() if line.startswith("  [numeric]")]
    assert failures and all("x axis 1 = " in line and "(export size 6)" in line for line in failures)
    found = entry(json.loads((tmp_path / "v.json").read_text()), "x", 1)
    assert found["status"] == "fail" and found["symbol"] == "seq" and found["sizes"] == [1, 3, 6, 15]


def test_verify_passes_a_faithful_artifact_torch_onnx_made_under_its_own_symbol(tmp_path):
    model, example = sized_models.mean_over_length()
    path = torchscript_onnx(tmp_path / "m.onnx", model, example, {"x": {1: "seq"}})
    report = api.verify(path, source=sized("mean_over_length"))
    passed(report)
    assert assert_held(report, "x", 1, [1, 3, 6, 15])["symbol"] == "seq"


EVEN_LENGTH = '''
import torch


class Pairs(torch.nn.Module):
    """Sums neighbouring pairs: a length that is odd is refused."""

    def forward(self, x):
        if x.shape[1] % 2:
            raise ValueError(f"length {x.shape[1]} is odd")
        return x.reshape(x.shape[0], -1, 2).sum(-1)


def build():
    torch.manual_seed(0)
    return Pairs().eval(), (torch.randn(2, 6),)
'''


def test_a_size_the_source_cannot_run_at_is_skipped_not_failed(tmp_path):
    import importlib.util

    (tmp_path / "pairs.py").write_text(EVEN_LENGTH)
    spec = importlib.util.spec_from_file_location("pairs", tmp_path / "pairs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, example = module.build()
    path = torchscript_onnx(tmp_path / "m.onnx", model, example, {"x": {0: "batch", 1: "length"}})

    report = api.verify(path, source=f"{tmp_path / 'pairs.py'}:build")
    passed(report)
    assert_held(report, "x", 0, [1, 2, 3, 7])
    length = entry(report, "x", 1)
    assert length["status"] == "skipped" and length["sizes"] == [1, 3, 6, 15]
    for size in (1, 3, 15):
        assert f"{size} skipped: the source model fails: ValueError: length {size} is odd" in length["detail"]
    assert list(length["max_abs_err"]) == ["6"]  # the artifact ran at no size the source refused
    assert any(line.startswith("  x axis 1 not checked at other sizes: 1 skipped") for line in report.summary_lines())


# ---- 8: third-party models ------------------------------------------------------------------------


def assert_bert_held(report, out: Path) -> None:
    """Every batch and length held, input_ids and attention_mask moving together."""
    passed(report)
    batch = [assert_held(report, name, 0, [1, 2, 3, 7]) for name in ("input_ids", "attention_mask")]
    length = [assert_held(report, name, 1, [1, 3, 8, 19]) for name in ("input_ids", "attention_mask")]
    assert len({e["symbol"] for e in batch}) == 1 and len({e["symbol"] for e in length}) == 1
    assert batch[0]["symbol"] != length[0]["symbol"]
    params = dim_params(out)
    assert params["input_ids"] == params["attention_mask"] == [batch[0]["symbol"], length[0]["symbol"]]


@pytest.fixture(scope="module")
def bert_torchscript(tmp_path_factory):
    """BERT exported with the TorchScript exporter, batch and length dynamic: (report, artifact)."""
    out = tmp_path_factory.mktemp("bert") / "m.onnx"
    return api.export(f"{HF}:bert", to="onnx", opset=17, exporter="torchscript", dynamic=BERT_AXES, out=out), out


def test_bert_torchscript_holds_at_every_batch_and_length_its_inputs_sharing_the_symbols(bert_torchscript):
    assert_bert_held(*bert_torchscript)


@pytest.mark.slow
def test_bert_dynamo_holds_at_every_batch_and_length_its_inputs_sharing_the_symbols(tmp_path):
    out = tmp_path / "m.onnx"
    assert_bert_held(api.export(f"{HF}:bert", to="onnx", opset=18, exporter="dynamo", dynamic=BERT_AXES, out=out),
                     out)


@pytest.mark.slow
def test_gpt2_holds_at_every_batch_and_length_up_to_its_positions(tmp_path):
    report = api.export(f"{CORPUS}:gpt2", to="onnx", opset=18, exporter="dynamo",
                        dynamic=["input_ids:0", "input_ids:1"], out=tmp_path / "m.onnx")
    passed(report)
    assert_held(report, "input_ids", 0, [1, 2, 3, 7])
    assert_held(report, "input_ids", 1, [1, 3, 8, 16])  # n_positions=16 caps 2 x 8 + 3


@pytest.mark.slow
def test_vit_holds_at_every_batch(tmp_path):
    report = api.export(f"{CORPUS}:vit", to="onnx", opset=17, exporter="torchscript",
                        dynamic=["pixel_values:0"], out=tmp_path / "m.onnx")
    passed(report)
    assert_held(report, "pixel_values", 0, [1, 3, 5])  # exported at a batch of 1


# (wrapper in sized_transformers.py, --dynamic, the axis named, its export size)
BROKEN_TRANSFORMERS = [
    pytest.param("bert_mean_by_traced_length", ["input_ids:1", "attention_mask:1"],
                 "input_ids axis 1, attention_mask axis 1", 8, id="bert"),
    pytest.param("gpt2_flattened_by_traced_batch", ["input_ids:0"], "input_ids axis 0", 2, id="gpt2",
                 marks=pytest.mark.slow),
    pytest.param("vit_tokens_by_traced_batch", ["pixel_values:0"], "pixel_values axis 0", 2, id="vit",
                 marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("name", "dynamic", "where", "export_size"), BROKEN_TRANSFORMERS)
def test_a_transformers_wrapper_that_bakes_a_size_fails(tmp_path, name, dynamic, where, export_size):
    report = api.export(f"{SIZED_TRANSFORMERS}:{name}", to="onnx", opset=17, exporter="torchscript",
                        dynamic=dynamic, out=tmp_path / "m.onnx")
    assert report.exit_code == 1, report.summary_lines()
    numeric = [f.message for f in report.failures if f.kind == "numeric"]
    assert numeric and all(f" at {where} = " in m and f"(export size {export_size})" in m for m in numeric), numeric
    assert {d["status"] for d in report.dynamic} == {"fail"} and len(report.dynamic) == len(dynamic)
    # the int() of the wrapper is the first hint; transformers' own tracer warnings are at most one more, counted
    line = int_call_line(SIZED_TRANSFORMERS, name)
    traced = [h for h in report.dynamic_hints if h["kind"] == "traced_number"]
    assert traced[0]["location"] == f"{SIZED_TRANSFORMERS}:{line}", report.dynamic_hints
    assert all("installed libraries" in h["message"] for h in traced[1:]) and len(traced) <= 2, traced
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.slow
@pytest.mark.parametrize("to", ["onnx", "tflite"])
def test_a_keras_application_holds_at_every_batch(tmp_path, to):
    out = tmp_path / f"m.{to}"
    report = api.export(f"{SIZED_TRANSFORMERS}:mobilenet_v3_small", to=to, opset=17 if to == "onnx" else None,
                        out=out)
    passed(report)
    [found] = report.dynamic
    assert found["axis"] == 0 and found["export_size"] == 2
    assert_held(report, found["input"], 0, [1, 2, 3, 7])
    assert [d["axis"] for d in api.inspect(out)["inputs"][0]["dynamic_axes"]] == [0]


# ---- 9: PyTorch -> TFLite -------------------------------------------------------------------------


def test_torch_to_tflite_refuses_dynamic_axes_exit_4(cli, tmp_path):
    # tests/exporter/routes/test_torch_tflite.py covers the route's refusal; this is the CLI's exit and line.
    result = cli("export", sized("flatten_mlp"), "--to", "tflite", "--dynamic", "input:0", "--out", "m.tflite")
    assert result.returncode == 4, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("  [target]")]
    assert re.search(r"--dynamic input(:| axis )0\b", line) and "static shapes only" in line, line
    assert not (tmp_path / "m.tflite").exists()


# ---- 10: JUnit and inspect ------------------------------------------------------------------------


def test_junit_of_a_failing_run_has_a_dynamic_case_per_axis(cli, tmp_path):
    result = cli("export", sized("mean_by_traced_length"), "--to", "onnx", "--opset", "17", "--exporter",
                 "torchscript", "--dynamic", "x:0", "--dynamic", "x:1", "--out", "m.onnx", "--junit", "j.xml")
    assert result.returncode == 1, result.stderr
    cases = read_junit(tmp_path / "j.xml")
    dynamic = {name: case for (classname, name), case in cases.items() if classname == "dynamic"}
    assert set(dynamic) == {"x axis 0", "x axis 1"}
    assert not [r for r in dynamic["x axis 0"].result if isinstance(r, Failure)]  # the batch holds
    [failure, *_] = [r for r in dynamic["x axis 1"].result if isinstance(r, Failure)]
    assert "x axis 1 = " in failure.message and "(export size 6)" in failure.message


def test_inspect_json_lists_the_dynamic_axes_of_each_input(cli, bert_torchscript):
    report, out = bert_torchscript
    passed(report)
    result = cli("inspect", str(out), "--json")
    assert result.returncode == 0, result.stderr
    inputs = {t["name"]: t["dynamic_axes"] for t in json.loads(result.stdout)["inputs"]}
    axes = [{"axis": 0, "symbol": "batch"}, {"axis": 1, "symbol": "dim1"}]
    assert inputs == {"input_ids": axes, "attention_mask": axes}
    text = cli("inspect", str(out)).stdout  # a symbol is shown as a dimension, not joined to the next
    assert "  input_ids: [batch, dim1] int64; dynamic: axis 0 (batch), axis 1 (dim1)" in text.splitlines()
