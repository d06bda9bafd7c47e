"""Report writers are found by name: the JSON writer, a second writer registered beside it, and
one refusal line for a writer or a file that cannot be."""

import json
import sys
import types

import pytest

from exporter import api
from verifiers.errors import BadInput
from verifiers.report import Report
from verifiers.writers import WRITERS, write_reports


@pytest.fixture
def text_writer():
    """A writer module as a newcomer would add one: OPTION and write(report, path)."""
    module = types.ModuleType("exportgate_test_text_writer")
    module.OPTION = "--text"
    module.write = lambda report, path: path.write_text("\n".join(report.summary_lines()) + "\n")
    sys.modules[module.__name__] = module
    WRITERS.register("text", module.__name__)
    yield module
    WRITERS.unregister("text")
    del sys.modules[module.__name__]


def test_every_writer_asked_for_writes_the_same_report(tmp_path, text_writer):
    report = api.check(tmp_path / "missing.onnx", target="ort-1.32",
                       reports={"json": tmp_path / "r.json", "text": tmp_path / "r.txt"})
    assert report.exit_code == 2
    assert json.loads((tmp_path / "r.json").read_text())["exit_code"] == 2
    assert (tmp_path / "r.txt").read_text().startswith("exportgate: error: ")


def test_an_unknown_writer_or_an_unwritable_file_is_one_line(tmp_path):
    with pytest.raises(BadInput, match=r"unknown report writer \(known: json, junit, html, summary\)"):
        write_reports(Report(command="check"), {"pdf": tmp_path / "r.pdf"})
    (tmp_path / "folder").mkdir()
    with pytest.raises(BadInput, match=r"^--report .*folder: is a folder; give a file path$"):
        write_reports(Report(command="check"), {"json": tmp_path / "folder"})


def test_lists_that_grow_with_the_model_are_capped_with_their_count_unless_asked():
    from verifiers.report import LIST_CAP

    ops = [{"node": f"n{k}", "op_type": "MatMul", "tensor": f"t{k}", "dtype": "float32"} for k in range(LIST_CAP + 7)]
    report = Report(command="verify", quantization={"mode": "mixed", "float_ops": ops})
    report.fail("target", "float compute", data={"float_ops": ops})
    written = json.loads(json.dumps(report.to_dict()))
    assert written["quantization"]["float_ops"] == ops[:LIST_CAP]
    assert written["quantization"]["float_ops_total"] == LIST_CAP + 7
    assert written["failures"][0]["data"]["float_ops_total"] == LIST_CAP + 7
    report.full_lists = True
    kept = report.to_dict()["quantization"]
    assert kept["float_ops"] == ops and "float_ops_total" not in kept
