"""The JUnit XML report (written with junitparser), for CI systems that show test results: GitLab,
Jenkins, GitHub Actions through a test-report action.

One testsuite per job (for one command, the job is its artifact or model), one testcase per check,
each with its one-line message on failure and its time:

  classname "run"     the command itself: the export, the artifact's load, every finding no
                      check below claims (bad input, a crashed runtime, an opset the exporter missed);
                      the report's notes are its system-out
  classname "output"  each output's comparison, and each output of the runtime's other variants
                      ("builtin: logits"); failing with the comparison's message
  classname "gelu"    each GELU site pair ("0:gelu -> 0:/act/Erf"): kept or declared pass, changed,
                      removed and added fail, unused are skipped; a guard that could not read the
                      source fails, a guard turned off is skipped
  classname "target"  each incompatibility with --target, or one passing case for a compatible artifact
  classname "dynamic" each dynamic axis ("x axis 1"): passing when the artifact holds at every size
                      tried, failing with the first difference or error at another size (or the
                      axis that came out static), skipped when no other size could be run
  classname "divergence" where the outputs' difference starts, when it was localised: failing
                      with the first divergence's line (the op, its module and source line, the
                      error it introduces), skipped when no single op introduces it, passing when
                      nothing diverges

The suite's properties give the verdict, exit code, artifact, hash and versions.
"""

from __future__ import annotations

from pathlib import Path
from xml.dom import minidom

from verifiers.report import Finding, OutputResult, Report
from verifiers.writers import atomic_write, job_name

OPTION = "--junit"
HELP = ("Write a JUnit XML report here: one test case per check (export, each output, each GELU site, each "
        "target check), for CI test views.")

_GELU_FAILED = ("changed", "removed", "added")
_OUTPUT_STEPS = ("run_artifact", "compare")
_GELU_STEPS = ("gelu_source", "gelu", "gelu_sensitivity")
_TARGET_STEPS = ("target_check",)
_MEASURE_STEPS = ("measure",)
_SIZE_STEPS = ("sizes",)
_DIVERGENCE_STEPS = ("localize",)


def write(report: Report, path: Path) -> None:
    write_jobs([(job_name(report), report)], path)


def write_jobs(jobs: list[tuple[str, Report]], path: Path) -> None:
    """One testsuite per (job name, report), in one file."""
    from junitparser import JUnitXml

    xml = JUnitXml("exportgate")
    for name, report in jobs:
        xml.add_testsuite(testsuite(name, report))
    xml.update_statistics()
    atomic_write(path, minidom.parseString(xml.tostring()).toprettyxml(indent="  ", encoding="utf-8").decode())


def testsuite(name: str, report: Report):
    from junitparser import TestSuite

    suite = TestSuite(name)
    for key, value in _properties(report).items():
        suite.add_property(key, value)
    placed: set[int] = set()
    cases = [*_output_cases(report, placed), *_dynamic_cases(report, placed), *_divergence_cases(report),
             *_gelu_cases(report, placed), *_target_cases(report, placed), *_budget_cases(report, placed)]
    suite.add_testcase(_run_case(report, [f for f in report.failures if id(f) not in placed]))
    for case in cases:
        suite.add_testcase(case)
    return suite


def _case(classname: str, name: str, seconds: float, failures: list[Finding] = (), skipped: str | None = None):
    from junitparser import Failure, Skipped, TestCase

    case = TestCase(name, classname, round(seconds, 4))
    if failures:
        failure = Failure(failures[0].message, failures[0].kind)
        failure.text = "\n".join(f"[{f.kind}] {f.message}" for f in failures)
        case.result = [failure]
    elif skipped is not None:
        case.result = [Skipped(skipped)]
    return case


def _run_case(report: Report, unclaimed: list[Finding]):
    claimed_steps = (*_OUTPUT_STEPS, *_SIZE_STEPS, *_DIVERGENCE_STEPS, *_GELU_STEPS, *_TARGET_STEPS, *_MEASURE_STEPS)
    seconds = sum(t for step, t in report.timings.items() if step not in claimed_steps)
    case = _case("run", report.command, seconds, unclaimed)
    if report.notes:
        case.system_out = "\n".join(report.notes)
    return case


def _output_cases(report: Report, placed: set[int]):
    runs: list[tuple[str, OutputResult]] = [("", o) for o in report.outputs]
    runs += [(f"{variant}: ", o) for variant, outputs in report.variant_outputs.items() for o in outputs]
    seconds = _share(report, _OUTPUT_STEPS, len(runs))
    for prefix, result in runs:
        variant = prefix[:-2]
        found = [f for f in report.failures if f.kind == "numeric" and f.output == result.name
                 and "dynamic" not in f.data and id(f) not in placed and f.data.get("variant", "") == variant]
        placed.update(map(id, found))
        if not found and not result.passed:
            found = [Finding("numeric", f"output {result.name}: max abs err {result.max_abs_err:.3g} "
                                        f"(atol {result.atol:g}, rtol {result.rtol:g})")]
        yield _case("output", prefix + result.name, seconds, found)


def _dynamic_cases(report: Report, placed: set[int]):
    seconds = _share(report, _SIZE_STEPS, len(report.dynamic))
    for entry in report.dynamic:
        found = [f for f in report.failures if _about_axis(f, entry) and id(f) not in placed]
        placed.update(map(id, found))
        if not found and entry["status"] == "fail":
            found = [Finding("numeric", entry["detail"])]
        yield _case("dynamic", f"{entry['input']} axis {entry['axis']}", seconds, found,
                    skipped=entry["detail"] if entry["status"] == "skipped" else None)


def _about_axis(finding: Finding, entry: dict) -> bool:
    """Whether a finding is about this axis: a failure at one of its symbol's sizes, or the axis
    found static in the artifact."""
    about = finding.data.get("dynamic")
    if about is None:
        return False
    if "symbol" in about:
        return about["symbol"] == entry["symbol"]
    return (about["input"], about["axis"]) == (entry["input"], entry["axis"])


def _budget_cases(report: Report, placed: set[int]):
    """One `measure` case per budget the measurement was held to (verifiers.measurement.overruns):
    latency and peak memory, each against its limit and against the baseline."""
    budgets = report.measurement.get("budgets", {})
    held = [(metric, False) for metric, name in (("latency", "max_latency"), ("peak memory", "max_memory"))
            if budgets.get(name) is not None]
    if budgets.get("baseline") is not None or budgets.get("baseline_artifact") is not None:
        held += [("latency", True), ("peak memory", True)]
    seconds = _share(report, _MEASURE_STEPS, len(held))
    for metric, against in held:
        found = [f for f in report.failures if f.kind == "budget" and f.data.get("metric") == metric
                 and (f.data.get("baseline") is not None) == against]
        placed.update(map(id, found))
        yield _case("measure", f"{metric} against the baseline" if against else metric, seconds, found)


def _divergence_cases(report: Report):
    divergence = report.divergence
    if not divergence.get("message"):
        return
    seconds = _share(report, _DIVERGENCE_STEPS, 1)
    if divergence.get("first"):
        yield _case("divergence", "first divergence", seconds, [Finding("numeric", divergence["message"])])
    elif any(point["max_abs"] > point["tolerance"] for point in divergence.get("profile", ())):
        yield _case("divergence", "first divergence", seconds, skipped=divergence["message"])
    else:
        case = _case("divergence", "first divergence", seconds)
        case.system_out = divergence["message"]
        yield case


def _gelu_cases(report: Report, placed: set[int]):
    guard = [f for f in report.failures if f.kind == "gelu_guard"]
    placed.update(map(id, guard))
    if guard or report.gelu_guard.startswith("off"):
        yield _case("gelu", "GELU guard", _share(report, _GELU_STEPS, 1), guard, skipped=report.gelu_guard)
    seconds = _share(report, _GELU_STEPS, len(report.gelu))
    for entry in report.gelu:
        name = f"{entry['source_site'] or '-'} -> {entry['site'] or '-'}"
        if entry["status"] in _GELU_FAILED:
            found = [f for f in report.failures if f.kind == "gelu" and f.message == entry["message"]]
            placed.update(map(id, found))
            yield _case("gelu", name, seconds, found or [Finding("gelu", entry["message"])])
        else:
            yield _case("gelu", name, seconds,
                        skipped=entry["message"] if entry["status"] in ("unused", "indistinguishable") else None)


def _target_cases(report: Report, placed: set[int]):
    if report.target is None:
        return
    found = [f for f in report.failures if "incompatibility" in f.data]
    placed.update(map(id, found))
    seconds = _share(report, _TARGET_STEPS, max(len(found), 1))
    if not found:
        yield _case("target", report.target, seconds)
    for k, finding in enumerate(found):
        yield _case("target", f"{report.target}: {finding.data['incompatibility']} {k + 1}", seconds, [finding])


def _share(report: Report, steps: tuple[str, ...], count: int) -> float:
    return sum(report.timings.get(step, 0.0) for step in steps) / max(count, 1)


def _properties(report: Report) -> dict[str, str]:
    facts = {
        "verdict": report.verdict, "exit_code": report.exit_code, "command": report.command,
        "model": report.model, "format": report.format, "opset": report.actual_opset,
        "exporter": report.exporter, "runtime": report.runtime, "target": report.target,
        "gelu_guard": report.gelu_guard,
        "artifact": report.artifact.path if report.artifact else None,
        "sha256": report.artifact.sha256 if report.artifact else None,
        "rejected_artifact": report.rejected_artifact,
        **{f"version {name}": version for name, version in report.versions.items()},
    }
    return {key: str(value) for key, value in facts.items() if value is not None}
