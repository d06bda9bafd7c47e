"""The Markdown summary: the verdict, a table of the jobs (with their measured latency and peak
memory, where they were measured) and every failure, short enough for a CI job page (GitHub Actions shows it from $GITHUB_STEP_SUMMARY, which the CLI appends it to)."""

from __future__ import annotations

from pathlib import Path

from verifiers.report import Report
from verifiers.writers import atomic_write, job_name

OPTION = "--summary"
HELP = ("Write a Markdown summary here (verdict, the job, every failure). On GitHub Actions it is also "
        "appended to $GITHUB_STEP_SUMMARY.")


def write(report: Report, path: Path) -> None:
    write_jobs([(job_name(report), report)], path)


def write_jobs(jobs: list[tuple[str, Report]], path: Path) -> None:
    atomic_write(path, render(jobs))


def render(jobs: list[tuple[str, Report]]) -> str:
    failed = [(name, report) for name, report in jobs if report.exit_code != 0]
    verdict = "FAIL" if failed else "PASS"
    lines = [f"### exportgate: {verdict}", "",
             f"{len(jobs) - len(failed)} of {len(jobs)} job(s) pass.", "",
             "| job | verdict | exit | format | opset | GELU sites | dynamic axes | max abs err | int8 SQNR | latency "
             "| peak memory |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, report in jobs:
        changed = sum(g["status"] in ("changed", "removed", "added") for g in report.gelu)
        unresolved = sum(g["status"] == "indistinguishable" for g in report.gelu)
        gelu = (f"{len(report.gelu) - changed - unresolved} kept, {changed} changed"
                + (f", {unresolved} not distinguishable at int8" if unresolved else "")) if report.gelu \
            else report.gelu_guard
        worst = max((o.max_abs_err or 0.0 for o in report.outputs), default=None)
        lines.append(f"| {_cell(name)} | {'✅ pass' if report.exit_code == 0 else '❌ fail'} | {report.exit_code} "
                     f"| {report.format or ''} | {report.actual_opset or ''} | {gelu} | {_cell(_dynamic(report))} "
                     f"| {'' if worst is None else f'{worst:.3g}'} | {_sqnr(report)} | {_latency(report)} "
                     f"| {_peak(report)} |")
    for name, report in failed:
        lines += ["", f"**{_cell(name)}**", ""]
        lines += [f"- `{finding.kind}`: {_cell(finding.message)}" for finding in report.failures]
        if report.divergence.get("message"):
            lines.append(f"- {_cell(report.divergence['message'])}")
    return "\n".join(lines) + "\n"


def _sqnr(report: Report) -> str:
    """The worst output SQNR of an int8 artifact (`identical` when no output differs), else empty."""
    judged = [o for o in report.outputs if o.min_sqnr_db is not None]
    if not judged:
        return ""
    sqnr = [o.sqnr_db for o in judged if o.sqnr_db is not None]
    return f"{min(sqnr):.1f} dB" if sqnr else "identical"


def _latency(report: Report) -> str:
    """The measured median latency of the way that ships, its 95% interval and batch (--measure)."""
    if not report.measurement:
        return ""
    first = report.measurement["timings"][0]
    return f"{first['median_ms']:.3g} ms [{first['low_ms']:.3g}, {first['high_ms']:.3g}], batch {first['batch']}"


def _peak(report: Report) -> str:
    return f"{report.measurement['peak_rss_mb']:.0f} MB" if report.measurement else ""


def _dynamic(report: Report) -> str:
    """`x axis 0 at 1, 2, 3, 7`, one per axis, with its status when it did not pass."""
    return "; ".join(f"{d['input']} axis {d['axis']} at {', '.join(map(str, d['sizes'])) or '-'}"
                     + ("" if d["status"] == "pass" else f" ({d['status']})") for d in report.dynamic)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
