"""The JUnit report, read back with junitparser: one test case per check, failures with their
one-line message, on faithful and broken artifacts (a transformers BERT among them)."""

import pytest
from junitparser import Failure, JUnitXml, Skipped

from exporter import api
from fixtures.make_broken_onnx import build_fixture
from fixtures.models.hf_models import __file__ as HF_MODELS
from fixtures.specs import torch_model


def read(path):
    [suite] = list(JUnitXml.fromfile(str(path)))
    cases = {(case.classname, case.name): case for case in suite}
    properties = {p.name: p.value for p in suite.properties()}
    return suite, cases, properties


def failure(case):
    found = [r for r in case.result if isinstance(r, Failure)]
    return found[0] if found else None


def test_a_faithful_export_is_one_passing_case_per_check(tmp_path):
    report = api.export(f"{HF_MODELS}:bert", to="onnx", opset=17, out=tmp_path / "bert.onnx",
                        reports={"junit": tmp_path / "bert.xml", "json": tmp_path / "bert.json"})
    assert report.exit_code == 0, report.summary_lines()
    suite, cases, properties = read(tmp_path / "bert.xml")
    assert suite.name == str(tmp_path / "bert.onnx") and suite.failures == 0 and suite.errors == 0
    assert ("run", "export") in cases
    assert {name for kind, name in cases if kind == "output"} == {"last_hidden_state", "pooler_output"}
    gelu = [name for kind, name in cases if kind == "gelu"]
    assert len(gelu) == len(report.gelu) == 2 and all(" -> " in name for name in gelu)
    assert all(not case.result for case in cases.values())
    assert properties["verdict"] == "pass" and properties["sha256"] == report.artifact.sha256
    assert properties["version onnxruntime"] == report.versions["onnxruntime"]
    assert cases[("run", "export")].time > 0


def test_a_gelu_that_changed_fails_its_site_case_naming_both_flavours(tmp_path):
    fixture = build_fixture("exact_to_tanh", tmp_path)
    report = api.verify(fixture.path, source=fixture.source, atol=["1e-3"], reports={"junit": tmp_path / "v.xml"})
    assert report.exit_code == 3
    suite, cases, properties = read(tmp_path / "v.xml")
    failed = {key: failure(case) for key, case in cases.items() if failure(case)}
    assert failed and all(kind == "gelu" for kind, _ in failed)
    assert len(failed) == len(fixture.changed_sites)
    for result in failed.values():
        assert result.type == "gelu" and "exact" in result.message and "tanh" in result.message
    # What the changed site computed on the probes travels in the report, for plots.
    [changed] = [g for g in report.gelu if g["status"] == "changed"]
    assert len(changed["probes"]["x"]) == len(changed["probes"]["y"]) >= 20
    assert properties["verdict"] == "fail" and properties["exit_code"] == "3"
    assert suite.failures == len(failed)
    # The outputs passed: the report's note that only the guard saw it reaches the CI view.
    assert not failure(cases[("output", "output")])
    assert "cannot tell exact GELU from tanh" in cases[("run", "verify")].system_out


def test_outputs_that_differ_fail_their_output_case(tmp_path):
    report = api.export(torch_model("sign_branch"), to="onnx", opset=17, out=tmp_path / "m.onnx",
                        reports={"junit": tmp_path / "m.xml"})
    assert report.exit_code == 1
    _, cases, properties = read(tmp_path / "m.xml")
    assert failure(cases[("output", "output")]).type == "numeric"
    assert failure(cases[("output", "output")]).message == report.failures[0].message
    assert not failure(cases[("run", "export")])
    assert properties["rejected_artifact"] == report.rejected_artifact


def test_every_target_incompatibility_is_a_failing_case_and_a_compatible_target_one_passing(tmp_path):
    exported = api.export(torch_model("mlp_exact"), to="onnx", opset=20, out=tmp_path / "m.onnx")
    assert exported.exit_code == 0
    old = api.check(tmp_path / "m.onnx", target="ort-1.16", reports={"junit": tmp_path / "old.xml"})
    assert old.exit_code == 4
    _, cases, _ = read(tmp_path / "old.xml")
    target_cases = [case for (kind, _), case in cases.items() if kind == "target"]
    assert len(target_cases) == len(old.target_checks) >= 1
    assert {failure(case).message for case in target_cases} == {c["message"] for c in old.target_checks}

    new = api.check(tmp_path / "m.onnx", target="ort-1.32", reports={"junit": tmp_path / "new.xml"})
    assert new.exit_code == 0
    _, cases, _ = read(tmp_path / "new.xml")
    assert not cases[("target", "ort-1.32")].result


def test_bad_input_fails_the_run_case_and_a_guard_turned_off_is_skipped(tmp_path, cli):
    result = cli("check", "missing.onnx", "--target", "ort-1.32", "--junit", "r.xml")
    assert result.returncode == 2
    _, cases, _ = read(tmp_path / "r.xml")
    assert "no such file" in failure(cases[("run", "check")]).message

    result = cli("export", torch_model("mlp_exact"), "--to", "onnx", "--opset", "17", "--out", "m.onnx",
                 "--no-gelu-guard", "--junit", "e.xml")
    assert result.returncode == 0, result.stderr
    _, cases, _ = read(tmp_path / "e.xml")
    [skipped] = cases[("gelu", "GELU guard")].result
    assert isinstance(skipped, Skipped) and "off" in skipped.message


@pytest.mark.parametrize("command", ["export", "verify", "check"])
def test_junit_is_an_option_of_the_commands_that_judge(cli, command):
    assert "--junit" in cli(command, "--help").stdout
