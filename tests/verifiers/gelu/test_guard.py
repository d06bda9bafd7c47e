"""The GELU guard end to end: every broken fixture exits 3 naming its site; every faithful one passes."""

import json

import pytest

from exporter import api
from fixtures.make_broken_onnx import FIXTURES, build_fixture
from fixtures.specs import keras_model, torch_model
from verifiers.gelu.catalogue import IDENTITY, RELU

BROKEN = sorted(name for name, recipe in FIXTURES.items() if recipe.expected != "faithful")
FAITHFUL = sorted(name for name, recipe in FIXTURES.items() if recipe.expected == "faithful")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("fixtures")
    return lambda name: build_fixture(name, out)


@pytest.mark.parametrize("name", BROKEN)
def test_broken_fixture_exits_3_naming_the_site(built, name):
    fixture = built(name)
    report = api.verify(fixture.path, source=fixture.source)

    assert report.exit_code == 3, report.summary_lines()
    gelu_failures = [f for f in report.failures if f.kind == "gelu"]
    assert len(gelu_failures) == len(fixture.changed_sites)
    changed = [g for g in report.gelu if g["status"] != "kept"]
    assert [g["source_site"].split(":")[0] for g in changed] == [str(k) for k in fixture.changed_sites]
    for entry in changed:
        assert entry["source_flavour"] == fixture.source_flavour
        if fixture.changed_to == IDENTITY:
            assert entry["status"] == "removed" and "GELU gone" in entry["message"]
        else:
            assert entry["status"] == "changed"
            assert entry["measured"] == fixture.changed_to or (fixture.changed_to == RELU and entry["op"] == "Relu")
            assert entry["site"] in entry["message"] and fixture.source_flavour in entry["message"]


@pytest.mark.parametrize("name", FAITHFUL)
def test_faithful_fixture_passes(built, name):
    fixture = built(name)
    report = api.verify(fixture.path, source=fixture.source)
    assert report.exit_code == 0, report.summary_lines()
    assert report.gelu and all(g["status"] == "kept" for g in report.gelu)


def test_gelu_change_fails_even_within_output_tolerance(built):
    fixture = built("exact_to_tanh")
    report = api.verify(fixture.path, source=fixture.source, atol=["1e-3"])
    assert report.outputs[0].passed  # the outputs alone would have shipped it
    assert report.exit_code == 3
    assert any("cannot tell exact GELU from tanh" in note for note in report.notes)


def test_typo_is_named_with_its_deviation(built):
    fixture = built("tanh_typo_0447")
    report = api.verify(fixture.path, source=fixture.source)
    [entry] = [g for g in report.gelu if g["status"] == "changed"]
    assert entry["claimed"] == "unknown" and entry["measured"] == "unknown"
    assert 5e-6 < entry["residuals"]["tanh"] < 2e-5
    assert "from tanh on the probes" in entry["message"]


@pytest.mark.parametrize("opset", [13, 17, 18, 20])
@pytest.mark.parametrize("model", ["mlp_exact", "block_tanh"])
def test_no_false_alarm_on_torch_exports(tmp_path, model, opset):
    report = api.export(torch_model(model), to="onnx", opset=opset, out=tmp_path / "m.onnx")
    assert report.exit_code == 0 and report.gelu_guard == "checked"
    assert [g["status"] for g in report.gelu] == ["kept"]


@pytest.mark.parametrize("name", ["sequential_activation", "functional_approximate", "functional_ops"])
def test_no_false_alarm_on_keras_exports(tmp_path, name):
    report = api.export(keras_model(name), to="onnx", opset=17, out=tmp_path / "m.onnx")
    assert report.exit_code == 0, report.summary_lines()
    assert [g["status"] for g in report.gelu] == ["kept"]


def test_cli_exit_3_one_line_per_site(built, cli, tmp_path):
    fixture = built("two_blocks_second_changed")
    result = cli("verify", fixture.path, "--source", fixture.source, "--report", "r.json")
    assert result.returncode == 3
    lines = [line for line in result.stderr.splitlines() if line.startswith("  [gelu]")]
    assert len(lines) == 1 and "is exact" in lines[0] and "computes tanh" in lines[0]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit_code"] == 3 and report["gelu_guard"] == "checked"


def test_float16_sites_are_judged_by_structure(tmp_path):
    report = api.export(torch_model("mlp_exact_fp16"), to="onnx", opset=17, out=tmp_path / "m.onnx")
    assert report.exit_code == 0, report.summary_lines()
    [entry] = report.gelu
    assert entry["status"] == "kept" and entry["confident"] is False
    assert "judged by structure: exact" in entry["note"]
    assert report.outputs[0].atol == 1e-2  # float16 tolerances


@pytest.mark.parametrize("opset", [17, 18, 20])
def test_factored_tanh_formula_is_found_on_both_sides(tmp_path, opset):
    report = api.export(torch_model("mlp_gelu_fast"), to="onnx", opset=opset, out=tmp_path / "m.onnx")
    assert report.exit_code == 0, report.summary_lines()
    assert [(g["status"], g["source_op"], g["source_flavour"], g["measured"]) for g in report.gelu] == [
        ("kept", "tanh-chain", "tanh", "tanh")]
