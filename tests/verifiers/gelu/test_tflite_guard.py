"""The GELU guard on TFLite end to end: broken files exit 3 naming the site, faithful ones pass,
corrupt ones are one-line bad input."""

import json

import pytest

from exporter import api
from fixtures.make_broken_tflite import FIXTURES, build_fixture
from fixtures.specs import keras_model, torch_model

BROKEN = sorted(n for n, r in FIXTURES.items() if r.expected == "gelu-changed")
FAITHFUL = sorted(n for n, r in FIXTURES.items() if r.expected == "faithful")
CORRUPT = sorted(n for n, r in FIXTURES.items() if r.expected == "bad-input")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("tflite_fixtures")
    return lambda name: build_fixture(name, out)


@pytest.mark.parametrize("name", BROKEN)
def test_broken_file_exits_3_naming_the_site(built, name):
    fixture = built(name)
    report = api.verify(fixture.path, source=fixture.source)
    assert report.exit_code == 3, report.summary_lines()
    changed = [g for g in report.gelu if g["status"] != "kept"]
    assert [int(g["source_site"].split(":")[0]) for g in changed] == list(fixture.changed_sites)
    for entry in changed:
        assert entry["site"] and entry["site"] in entry["message"]
    assert len([f for f in report.failures if f.kind == "gelu"]) == len(fixture.changed_sites)


@pytest.mark.parametrize("name", FAITHFUL)
def test_faithful_file_passes(built, name):
    fixture = built(name)
    report = api.verify(fixture.path, source=fixture.source)
    assert report.exit_code == 0, report.summary_lines()
    assert report.gelu and all(g["status"] == "kept" for g in report.gelu)
    assert set(report.variant_outputs) == {"builtin"}  # XNNPACK's outputs are report.outputs


@pytest.mark.parametrize("name", CORRUPT)
def test_corrupt_file_is_exit_2_in_one_line(built, cli, name):
    fixture = built(name)
    for args in (("verify", fixture.path, "--source", fixture.source), ("inspect", fixture.path)):
        result = cli(*args)
        assert result.returncode == 2, result.stderr[-500:]
        assert "Traceback" not in result.stderr
        errors = [line for line in result.stderr.splitlines() if "[input]" in line or "error:" in line]
        assert len(errors) == 1 and fixture.path.name in errors[0]


SOURCES = [keras_model(n) for n in ("sequential_activation", "functional_approximate", "functional_ops",
                                    "convnext_block")]
# PyTorch's are the slow suite's here: tests/exporter/routes/test_torch_tflite.py runs the same
# models through both interpreters and reads their GELU builtins' flavour by default.
SOURCES += [pytest.param(torch_model(n), marks=pytest.mark.slow) for n in ("mlp_exact", "mlp_tanh", "block_exact", "block_tanh")]


@pytest.mark.parametrize("quantize", [None, "fp16"])
@pytest.mark.parametrize("spec", SOURCES, ids=lambda spec: spec.rsplit("/", 1)[-1])
def test_export_to_tflite_verifies_with_both_interpreters(tmp_path, spec, quantize):
    report = api.export(spec, to="tflite", quantize=quantize, out=tmp_path / "m.tflite")
    assert report.exit_code == 0, report.summary_lines()
    assert report.min_runtime_version == "2.9.0"  # the GELU builtin
    assert [g["status"] for g in report.gelu] == ["kept"]
    assert report.variant_outputs["builtin"][0].passed
    if quantize:
        assert report.outputs[0].atol == 1e-2 and any("scaled for --quantize fp16" in n for n in report.notes)


def test_inspect_tflite_lists_ops_sites_and_runtime_version(built, cli):
    fixture = built("two_gelu_faithful")
    probe = ("import atexit, sys; atexit.register(lambda: print(sorted(m for m in ('torch', 'tensorflow', 'keras')"
             " if m in sys.modules), file=sys.stderr))")
    result = cli("inspect", fixture.path, "--json", prelude=probe)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().endswith("[]")
    info = json.loads(result.stdout)
    assert info["min_runtime_version"] == "2.9.0"
    assert {"op": "GELU", "version": 1} in info["ops"]
    assert [(g["claimed"], g["measured"]) for g in info["gelu"]] == [("exact", "exact"), ("exact", "exact")]


def test_each_interpreter_variants_differences_are_its_own_junit_case(built, tmp_path):
    """GELU pointed at ReLU changes the outputs under XNNPACK and the builtin kernels alike: each
    variant's output case fails with that variant's own finding."""
    from junitparser import Failure, JUnitXml

    fixture = built("gelu_to_relu")
    report = api.verify(fixture.path, source=fixture.source, reports={"junit": tmp_path / "m.xml"})
    [output] = report.outputs
    numeric = {f.data.get("variant"): f.message for f in report.failures
               if f.kind == "numeric" and "dynamic" not in f.data}  # the export's own sizes
    assert set(numeric) == {None, "builtin"}, numeric
    [suite] = list(JUnitXml.fromfile(str(tmp_path / "m.xml")))
    failed = {case.name: [r.message for r in case.result if isinstance(r, Failure)]
              for case in suite if case.classname == "output"}
    assert failed == {output.name: [numeric[None]], f"builtin: {output.name}": [numeric["builtin"]]}
