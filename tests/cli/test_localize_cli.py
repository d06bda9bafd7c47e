"""Where a red run starts, at the command line: the op, its module and source line, and the error it
introduces, on the console and in every report; nothing diverging on a faithful artifact; a
difference of rounding alone is no divergence; a source that does not load the same twice is not
traced; --no-localize leaves a red run as it was."""

import json
import re
from pathlib import Path

import onnx
import pytest

from fixtures.inject_faults import inject_onnx
from fixtures.localization_corpus import fx_node_of, fx_records

REPO = Path(__file__).resolve().parents[2]
BERT = f"{REPO / 'fixtures' / 'models' / 'localization_models.py'}:bert"
LINE = re.compile(r"^  first divergence: (\S+) (\S+) in (\S+) \((\S+)\): introduces max abs err [\d.e+-]+$", re.M)


@pytest.fixture(scope="module")
def bert_onnx(tmp_path_factory) -> Path:
    from exporter import api

    out = tmp_path_factory.mktemp("bert") / "bert.onnx"
    report = api.export(BERT, to="onnx", out=out)  # torch.onnx's dynamo exporter, the default
    assert report.exit_code == 0, report.summary_lines()
    return out


@pytest.fixture(scope="module")
def faulty(bert_onnx, tmp_path_factory) -> tuple[Path, onnx.NodeProto, int]:
    """The export with one weight of a MatMul perturbed, that node and its index (the injector's record)."""
    out = tmp_path_factory.mktemp("faulty") / "bert.onnx"
    fault = inject_onnx(bert_onnx, "weight_perturbed", out, seed=0)
    return out, onnx.load(str(out), load_external_data=False).graph.node[fault.op], fault.op


def test_a_red_verify_names_the_faulted_op_its_module_and_its_line(cli, faulty, tmp_path):
    from exporter.frameworks import load_source

    path, node, index = faulty
    result = cli("verify", path, "--source", BERT, "--quiet", "--report", "r.json", "--html", "r.html",
                 "--junit", "r.xml", "--summary", "r.md")

    assert result.returncode == 1, result.stdout + result.stderr
    match = LINE.search(result.stderr)  # the summary
    assert match, result.stderr
    # What torch.export recorded of the FX node the faulted op was made from: its module and stack.
    fx = fx_records(load_source(BERT), tmp_path)
    module, frames = fx[fx_node_of(path, index, fx)]
    assert match.groups()[:3] == (node.op_type, node.name, module), match.groups()
    assert match.group(4) in frames, (match.groups(), frames)
    divergence = json.loads((tmp_path / "r.json").read_text())["divergence"]
    first = divergence["first"]
    assert first["node"] == node.name and first["op_type"] == "MatMul"
    assert first["introduced_max_abs"] > first["tolerance"] > 0
    assert first["inherited_max_abs"] < first["tolerance"]  # it makes the error, it does not receive it
    assert divergence["path"] and all(step["index"] > first["index"] for step in divergence["path"])
    profiled = divergence.get("profile_total", len(divergence["profile"]))  # the JSON keeps the first LIST_CAP
    assert 0 < divergence["aligned"] <= divergence["computed"] and profiled == divergence["aligned"]
    line = match.group(0).strip()
    assert divergence["message"] == line
    page = (tmp_path / "r.html").read_text()
    assert "Where the difference starts" in page and line in page.replace("&#x27;", "'")
    from junitparser import JUnitXml

    cases = [case for suite in JUnitXml.fromfile(str(tmp_path / "r.xml")) for case in suite
             if case.classname == "divergence"]
    assert [case.result[0].message for case in cases] == [line]
    assert line in (tmp_path / "r.md").read_text()


def test_no_localize_leaves_a_red_run_as_it_was(cli, faulty, tmp_path):
    result = cli("verify", faulty[0], "--source", BERT, "--quiet", "--no-localize", "--report", "r.json")

    assert result.returncode == 1
    assert "divergence" not in result.stderr
    assert json.loads((tmp_path / "r.json").read_text())["divergence"] == {}


def test_a_faithful_artifact_localised_on_request_has_no_divergence(cli, bert_onnx, tmp_path):
    result = cli("verify", bert_onnx, "--source", BERT, "--quiet", "--localize", "--report", "r.json")

    assert result.returncode == 0, result.stderr
    assert re.search(r"^  no divergence: \d+ aligned tensor\(s\) agree with the source$", result.stderr, re.M)
    divergence = json.loads((tmp_path / "r.json").read_text())["divergence"]
    assert divergence["first"] is None and divergence["path"] == [] and divergence["aligned"] > 0


def test_a_difference_of_rounding_alone_is_no_divergence(cli, tmp_path):
    """The example exported with no tolerance at all: its outputs differ by float32 rounding, and
    no op of it introduces more than rounding."""
    result = cli("export", REPO / "examples" / "mlp.py:build", "--to", "onnx", "--out", "mlp.onnx", "--atol", "0",
                 "--rtol", "0", "--quiet", "--report", "r.json")

    assert result.returncode == 1, result.stderr
    divergence = json.loads((tmp_path / "r.json").read_text())["divergence"]
    assert divergence["first"] is None, divergence["message"]
    assert divergence["message"].startswith("no op introduces more than float32 rounding"), divergence["message"]
    assert divergence["message"] in result.stderr


def test_a_source_that_loads_differently_is_not_traced(cli, tmp_path):
    """Random weights without a seed: the run's reference and a second load disagree, so the
    artifact is not held against a model other than the one that ran."""
    (tmp_path / "unseeded.py").write_text(
        "import torch\n\n\ndef build():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)), "
        "(torch.ones(2, 4),)\n")
    assert cli("export", "unseeded.py:build", "--to", "onnx", "--out", "m.onnx", "--quiet").returncode == 0
    result = cli("verify", "m.onnx", "--source", "unseeded.py:build", "--quiet", "--report", "r.json")

    assert result.returncode == 1  # another load, other weights
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["divergence"] == {}
    assert any("gives other outputs when loaded again" in note for note in report["notes"]), report["notes"]
