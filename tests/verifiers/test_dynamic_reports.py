"""What the report and its writers say about dynamic axes: JUnit (read back with junitparser) has
one test case per axis, the HTML report a "Dynamic axes" table, the Markdown summary the sizes
per job, and the text summary the sizes that held or the hints of a run that failed at a size.
Reports are built here from verifiers.sizes plans, as verifiers.judging fills them."""

import re
from html.parser import HTMLParser

import pytest
from junitparser import Failure, JUnitXml, Skipped

from verifiers.report import OutputResult, Report
from verifiers.sizes import DynamicAxis, SymbolSizes
from verifiers.writers import write_reports
from verifiers.writers.markdown_summary import render

HELD = "output y: max abs err 0.33 at x axis 1 = 1 (export size 6)"
HINT = "Reshape node '/Reshape' reads the constant [2, -1], which holds 2, the export size of x axis 0"


def _output(name="y", passed=True, err=1e-7):
    return OutputResult(name, [2, 6], err, err, 0.0 if passed else 0.5, 1e-5, 1e-4, passed)


def passing_report() -> Report:
    """x axis 0 (the batch, exported at 2) held at 1, 2, 3 and 7."""
    report = Report(command="verify", model="m.py", format="onnx", actual_opset=17)
    report.outputs.append(_output())
    batch = SymbolSizes("batch", [DynamicAxis("x", 0, "batch")], 2, 1, None, [1, 2, 3, 7],
                        max_abs_err={1: 1e-7, 2: 1e-7, 3: 2e-7, 7: 1e-7})
    report.dynamic.extend(batch.entries())
    report.timings.update({"run_artifact": 0.2, "compare": 0.1, "sizes": 0.4})
    return report


def failing_report() -> Report:
    """x axis 0 held; x axis 1 (exported at 6, range 1..12) fails at 1 (a numeric finding there)."""
    report = passing_report()
    plan = SymbolSizes("dim1", [DynamicAxis("x", 1, "dim1", 1, 12)], 6, 1, 12, [1, 3, 6, 12],
                       max_abs_err={1: 0.33, 3: 0.0, 6: 1e-7, 12: 0.0})
    plan.failed[1] = HELD
    report.dynamic.extend(plan.entries())
    # as compare_at_sizes records it: compare_outputs' finding (it names its output), placed at the size
    report.fail("numeric", HELD, output="y", data={"dynamic": {"symbol": "dim1", "size": 1}, "max_abs_err": 0.33})
    report.dynamic_hints.append({"kind": "constant_shape", "location": "/Reshape", "message": HINT})
    return report


def read_junit(path):
    [suite] = list(JUnitXml.fromfile(str(path)))
    return suite, {(case.classname, case.name): case for case in suite}


def failures_of(case):
    return [r for r in case.result if isinstance(r, Failure)]


def test_junit_has_one_case_per_dynamic_axis_the_failing_one_with_the_findings_message(tmp_path):
    report = failing_report()
    report.outputs.clear()  # the dynamic case alone may claim the finding
    write_reports(report, {"junit": tmp_path / "r.xml"})
    suite, cases = read_junit(tmp_path / "r.xml")
    dynamic = {name: case for (kind, name), case in cases.items() if kind == "dynamic"}
    assert set(dynamic) == {"x axis 0", "x axis 1"}
    assert not dynamic["x axis 0"].result
    [failure] = failures_of(dynamic["x axis 1"])
    assert failure.message == HELD and failure.type == "numeric"
    assert "at x axis 1 = 1 (export size 6)" in failure.text
    assert not failures_of(cases[("run", "verify")])  # claimed by its axis, not left to the run case
    assert suite.failures == 1
    # the time of the runs at other sizes is shared by the axes, not counted in the run case
    assert dynamic["x axis 0"].time == dynamic["x axis 1"].time == pytest.approx(0.2)


def test_junit_skips_an_axis_no_other_size_could_run_at_and_fails_one_static_in_the_artifact(tmp_path):
    report = Report(command="export", model="m.py")
    skipped = SymbolSizes("batch", [DynamicAxis("x", 0, "batch")], 2, 1, None, [1, 2, 3, 7],
                          skipped={1: "the source model fails: n", 3: "the source model fails: n",
                                   7: "the source model fails: n"})
    static = SymbolSizes("dim1", [DynamicAxis("x", 1, "dim1")], 6, 1, None, [1, 3, 6, 15],
                         static="declared dynamic, static in the artifact (size 6)")
    report.dynamic += [*skipped.entries(), *static.entries()]
    report.fail("target", "input x axis 1 is dynamic in the source and static in the artifact (size 6)",
                data={"dynamic": {"input": "x", "axis": 1}})
    write_reports(report, {"junit": tmp_path / "r.xml"})
    _, cases = read_junit(tmp_path / "r.xml")
    [skip] = cases[("dynamic", "x axis 0")].result
    assert isinstance(skip, Skipped) and "7 skipped: the source model fails" in skip.message
    [failure] = failures_of(cases[("dynamic", "x axis 1")])
    assert failure.type == "target" and "static in the artifact (size 6)" in failure.message
    assert not failures_of(cases[("run", "export")])


def test_junit_a_difference_at_another_size_fails_its_axis_not_the_export_size_output(tmp_path):
    report = failing_report()  # output y passed at the export size; it differs only at x axis 1 = 1
    write_reports(report, {"junit": tmp_path / "r.xml"})
    suite, cases = read_junit(tmp_path / "r.xml")
    [failure] = failures_of(cases[("dynamic", "x axis 1")])
    assert failure.message == HELD
    assert not failures_of(cases[("output", "y")])
    assert suite.failures == 1


class Tables(HTMLParser):
    """The text of every cell of every table, per table, after the heading before it."""

    def __init__(self, text):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.heading = None
        self._in = None
        self._text = ""
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag in ("h3", "td", "th"):
            self._in, self._text = tag, ""
        elif tag == "tr" and self.heading is not None:
            self.tables.setdefault(self.heading, []).append([])

    def handle_data(self, data):
        if self._in:
            self._text += data

    def handle_endtag(self, tag):
        if tag == "h3" and self._in == "h3":
            self.heading = self._text
        elif tag in ("td", "th") and self._in == tag and self.heading in self.tables:
            self.tables[self.heading][-1].append(self._text)
        if tag == self._in:
            self._in = None


def test_the_html_report_has_a_dynamic_axes_table_with_the_sizes_and_the_hints(tmp_path):
    report = failing_report()
    write_reports(report, {"html": tmp_path / "r.html"})
    text = (tmp_path / "r.html").read_text()
    rows = Tables(text).tables["Dynamic axes"]
    assert rows[0] == ["status", "input", "axis", "symbol", "export size", "sizes tried", "range", "detail"]
    assert rows[1][:7] == ["pass", "x", "0", "batch", "2", "1, 2, 3, 7", "1.."]
    assert rows[2][:7] == ["fail", "x", "1", "dim1", "6", "1, 3, 6, 12", "1..12"]
    assert rows[2][7] == f"1: {HELD}"
    assert re.search(r"<td class='fail'>fail</td>", text) and re.search(r"<td class='pass'>pass</td>", text)
    assert "Hints (the verdict comes from the runs)" in text and "[2, -1]" in text
    # a report without dynamic axes has no such table
    write_reports(Report(command="verify"), {"html": tmp_path / "none.html"})
    assert "Dynamic axes" not in (tmp_path / "none.html").read_text()


def test_the_markdown_summary_lists_each_jobs_axes_and_sizes():
    text = render([("pass.onnx", passing_report()), ("fail.onnx", failing_report()), ("static.onnx", Report("check"))])
    header = next(line for line in text.splitlines() if line.startswith("| job |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert "dynamic axes" in columns
    rows = {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")]
                                          for line in text.splitlines() if line.startswith("| ") and "---" not in line)}
    column = columns.index("dynamic axes")
    assert rows["pass.onnx"][column] == "x axis 0 at 1, 2, 3, 7"
    assert rows["fail.onnx"][column] == "x axis 0 at 1, 2, 3, 7; x axis 1 at 1, 3, 6, 12 (fail)"
    assert rows["static.onnx"][column] == ""
    assert len(rows["pass.onnx"]) == len(columns)
    assert HELD in text  # the failing job's findings follow the table


def test_the_summary_says_which_sizes_held_on_a_pass():
    lines = passing_report().summary_lines()
    assert lines[0].startswith("PASS")
    assert "  dynamic axes hold at other sizes: x axis 0 at 1, 2, 3, 7" in lines
    assert not any("hint:" in line for line in lines)


def test_the_summary_names_axes_not_checked_at_other_sizes():
    report = passing_report()
    plan = SymbolSizes("dim1", [DynamicAxis("x", 1, "dim1")], 6, 1, None, [1, 3, 6, 15],
                       skipped={1: "no", 3: "no", 15: "no"})
    report.dynamic.extend(plan.entries())
    lines = report.summary_lines()
    assert "  dynamic axes hold at other sizes: x axis 0 at 1, 2, 3, 7" in lines  # the skipped axis is not claimed
    assert "  x axis 1 not checked at other sizes: 1 skipped: no; 3 skipped: no; 15 skipped: no" in lines


def test_the_summary_shows_the_hints_only_for_a_run_that_failed_at_a_size():
    failed = failing_report()
    lines = failed.summary_lines()
    assert lines[0].startswith("FAIL")
    assert f"  [numeric] {HELD}" in lines
    assert f"  hint: {HINT}" in lines
    assert not any("hold at other sizes" in line for line in lines)

    # the same hint on a passing run is not shown: the runs said the axis holds
    held = passing_report()
    held.dynamic_hints.append({"kind": "constant_shape", "location": "/Reshape", "message": HINT})
    assert not any("hint:" in line for line in held.summary_lines())

    # nor on a run that failed for another reason than a size
    other = passing_report()
    other.dynamic_hints.append({"kind": "constant_shape", "location": "/Reshape", "message": HINT})
    other.outputs[0] = _output(passed=False, err=0.5)
    other.fail("numeric", "output y: max abs err 0.5 (atol 1e-05, rtol 0.0001)", output="y",
               data={"max_abs_err": 0.5})
    lines = other.summary_lines()
    assert lines[0].startswith("FAIL") and not any("hint:" in line for line in lines)


def test_dynamic_entries_survive_the_json_report(tmp_path):
    import json

    report = failing_report()
    write_reports(report, {"json": tmp_path / "r.json"})
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["dynamic"] == report.dynamic and data["dynamic_hints"] == report.dynamic_hints
    again = Report.from_dict(data)
    assert again.dynamic == report.dynamic and again.summary_lines() == report.summary_lines()
