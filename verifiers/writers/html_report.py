"""The HTML report: one self-contained file (no script, no network, no external style or font)
that a reviewer opens in a browser.

At the top the verdict and a table of the jobs (one for a single command). Per job: its
failures; each output's error statistics with a histogram of the absolute errors by decade
against its tolerance; with --data, each output's statistics over the samples and its error
sample by sample; where the difference starts (the first divergence, the ops after it, and
a plot of the error along the graph's order, that op marked); each GELU site with a plot of what the artifact computed on the probes
over the source's flavour and the other flavours of the catalogue, and the residuals to each;
the target checks; notes, timings and versions. Plots are matplotlib figures inlined as SVG
(their ids prefixed with the figure's number, so no two elements of the page share one).
"""

from __future__ import annotations

import datetime
import html
import io
import math
import re
from pathlib import Path
from typing import Any

from verifiers.measurement import PROFILES, gelu_form_rows
from verifiers.report import OutputResult, Report
from verifiers.writers import atomic_write, job_name

OPTION = "--html"
HELP = ("Write an HTML report here: one self-contained page with the verdict, the error histogram of each "
        "output and a plot of each GELU site against the flavours.")

_ID_OR_REFERENCE = re.compile(r"""(\bid=["']|url\(#|href=["']#)([^"')]+)""")
_STATUS_CLASS = {"kept": "pass", "declared": "note", "indistinguishable": "note", "unused": "skip", "changed": "fail",
                 "removed": "fail", "added": "fail"}
_SIZE_STATUS_CLASS = {"pass": "pass", "fail": "fail", "skipped": "skip"}
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #1a1a1a; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; } h3 { margin-top: 1.5em; }
table { border-collapse: collapse; margin: .5em 0; } td, th { border: 1px solid #ccc; padding: .25em .6em;
  text-align: left; vertical-align: top; } th { background: #f3f3f3; }
.verdict { display: inline-block; padding: .2em .8em; border-radius: .3em; color: white; font-weight: bold; }
.verdict.pass, td.pass { background: #1b7f3b; color: white; } .verdict.fail, td.fail { background: #b3261e; color: white; }
td.skip { background: #ddd; } td.note { background: #f5d76e; }
.failures li { color: #b3261e; } .plot svg { max-width: 100%; height: auto; }
.muted { color: #666; font-size: .9em; } code { background: #f3f3f3; padding: 0 .2em; }
"""


def write(report: Report, path: Path) -> None:
    write_jobs([(job_name(report), report)], path)


def write_jobs(jobs: list[tuple[str, Report]], path: Path) -> None:
    """One page for several jobs (job name, report)."""
    page = _Page()
    verdict = "pass" if all(r.exit_code == 0 for _, r in jobs) else "fail"
    body = [
        f"<h1>exportgate <span class='verdict {verdict}'>{verdict.upper()}</span></h1>",
        f"<p class='muted'>{len(jobs)} job(s), written {_now()}</p>",
        _jobs_table(jobs),
    ]
    body += [page.job(k, name, report) for k, (name, report) in enumerate(jobs)]
    atomic_write(path, "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
                       f"<title>exportgate: {verdict}</title><style>{_STYLE}</style></head>"
                       f"<body>{''.join(body)}</body></html>\n")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _table(head: list[str], rows: list[list[str]]) -> str:
    """A table of already escaped cells (a cell may be (css class, text))."""
    def cell(value) -> str:
        if isinstance(value, tuple):
            return f"<td class='{value[0]}'>{value[1]}</td>"
        return f"<td>{value}</td>"
    header = "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>" if head else ""
    return ("<table>" + header
            + "".join("<tr>" + "".join(cell(c) for c in row) + "</tr>" for row in rows) + "</table>")


def _jobs_table(jobs: list[tuple[str, Report]]) -> str:
    rows = []
    for k, (name, report) in enumerate(jobs):
        worst = max((o.max_abs_err or 0.0 for o in report.outputs), default=None)
        changed = sum(g["status"] in ("changed", "removed", "added") for g in report.gelu)
        rows.append([
            f"<a href='#job{k}'>{_e(name)}</a>", (report.verdict, report.verdict.upper()), _e(report.exit_code),
            _e(report.format), _e(report.actual_opset), _e(report.exporter or report.runtime), _e(report.target),
            _e(f"{len(report.gelu) - changed} kept, {changed} changed" if report.gelu else report.gelu_guard),
            _e(f"{worst:.3g}" if worst is not None else ""), _e(f"{sum(report.timings.values()):.1f} s"),
        ])
    return _table(["job", "verdict", "exit", "format", "opset", "exporter / runtime", "target", "GELU",
                   "max abs err", "time"], rows)


class _Page:
    """Numbers the figures, so every inline SVG gets ids of its own."""

    def __init__(self):
        self.figures = 0

    def svg(self, figure) -> str:
        """The figure as an inline <svg>, every id in it (and every reference to one) prefixed
        with the figure's number: matplotlib names the groups of every figure alike."""
        import matplotlib

        self.figures += 1
        buffer = io.StringIO()
        with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text
            figure.savefig(buffer, format="svg", bbox_inches="tight")
        text = buffer.getvalue()
        text = _ID_OR_REFERENCE.sub(lambda m: f"{m[1]}fig{self.figures}-{m[2]}", text[text.index("<svg"):])
        return f"<div class='plot'>{text}</div>"

    def job(self, k: int, name: str, report: Report) -> str:
        parts = [f"<h2 id='job{k}'>{_e(name)} <span class='verdict {report.verdict}'>"
                 f"{report.verdict.upper()}</span></h2>", self._facts(report)]
        if report.failures:
            parts.append("<ul class='failures'>" + "".join(
                f"<li><b>{_e(f.kind)}</b>: {_e(f.message)}</li>" for f in report.failures) + "</ul>")
        if report.outputs:
            parts.append(self._outputs(report))
        if report.data.get("outputs"):
            parts.append(self._data(report.data))
        if report.divergence.get("message"):
            parts.append(self._divergence(report.divergence))
        if report.dynamic:
            parts.append(self._dynamic(report))
        if report.quantization.get("mode") not in (None, "float"):
            parts.append(self._quantization(report))
        if report.gelu or report.gelu_guard != "not run":
            parts.append(self._gelu(report))
        if report.measurement:
            parts.append(self._measurement(report.measurement))
        if report.target:
            parts.append(f"<h3>Target {_e(report.target)}</h3>" + (
                "<ul>" + "".join(f"<li><b>{_e(c['kind'])}</b>: {_e(c['message'])}</li>" for c in report.target_checks)
                + "</ul>" if report.target_checks else "<p>compatible, as far as the target matrix says</p>"))
        if report.notes:
            parts.append("<h3>Notes</h3><ul>" + "".join(f"<li>{_e(n)}</li>" for n in report.notes) + "</ul>")
        parts.append("<h3>Timings and versions</h3>" + _table(
            ["step", "seconds"], [[_e(step), _e(f"{t:.3f}")] for step, t in report.timings.items()]) + _table(
            ["package", "version"], [[_e(name), _e(version)] for name, version in report.versions.items()]))
        return "".join(parts)

    @staticmethod
    def _facts(report: Report) -> str:
        artifact = report.artifact
        facts = [("command", report.command), ("model", report.model),
                 ("artifact", artifact.path if artifact else None), ("sha256", artifact.sha256 if artifact else None),
                 ("format", report.format), ("opset", report.actual_opset), ("exporter", report.exporter),
                 ("runtime", report.runtime), ("rejected artifact", report.rejected_artifact)]
        return _table([], [[_e(k), f"<code>{_e(v)}</code>"] for k, v in facts if v is not None])

    def _outputs(self, report: Report) -> str:
        runs = [("", o) for o in report.outputs]
        runs += [(f"{variant}: ", o) for variant, outputs in report.variant_outputs.items() for o in outputs]
        integer = any(o.min_sqnr_db is not None for _, o in runs)
        rows = [[_e(prefix + o.name), _e(o.shape), _e(_g(o.max_abs_err)), _e(_g(o.max_rel_err)),
                 *([_e(_g(o.sqnr_db) or "identical"), _e(_g(o.cosine)), _e(_g(o.top1_agreement))] if integer else
                   [_e(_g(o.frac_out_of_tol)), _e(f"{o.atol:g} / {o.rtol:g}")]),
                 ("pass", "pass") if o.passed else ("fail", "fail")] for prefix, o in runs]
        judged_by = ["SQNR dB", "cosine", "top-1 agreement"] if integer else ["out of tolerance", "atol / rtol"]
        parts = ["<h3>Outputs</h3>", _table(["output", "shape", "max abs err", "max rel err", *judged_by, ""], rows)]
        parts += [self.svg(_histogram(prefix + o.name, o)) for prefix, o in runs if o.error_histogram]
        return "".join(parts)

    def _data(self, data: dict) -> str:
        """--data: what was fed, each output's statistics over the samples, and its max abs error
        sample by sample against its tolerance."""
        fed = f"{data['samples']} sample(s) of <code>{_e(data['spec'])}</code> in {data['batches']} batch(es) of " \
              f"{data['batch_size']}" + (f", {data['filled']} repeated to fill" if data["filled"] else "")

        def worst(entry: dict | None) -> str:
            return "" if not entry else f"{_g(entry['worst'])} (sample {entry['worst_sample']})"

        rows = [[_e((o["variant"] + ": " if o["variant"] else "") + o["name"]), _e(o["samples"]),
                 _e(o["samples_out_of_tolerance"]), _e(worst(o.get("max_abs"))), _e(_g((o.get("mean_abs") or {}).get("mean"))),
                 _e(worst(o.get("sqnr_db"))), _e(worst(o.get("cosine"))), _e(_g((o.get("top1") or {}).get("mean")))]
                for o in data["outputs"]]
        parts = [f"<h3>On the data</h3><p>{fed}</p>",
                 _table(["output", "samples", "out of tolerance", "max abs err (worst)", "mean abs err (mean)",
                         "SQNR dB (worst)", "cosine (worst)", "top-1 agreement (mean)"], rows)]
        parts += [self.svg(_by_sample_plot(o)) for o in data["outputs"] if o.get("max_abs_by_sample", {}).get("points")]
        return "".join(parts)

    def _divergence(self, divergence: dict) -> str:
        """The line, the first divergence and the ops after it, and the error along the graph."""
        parts = [f"<h3>Where the difference starts</h3><p class='divergence'><b>{_e(divergence['message'])}</b></p>",
                 f"<p class='muted'>localised on {_e(divergence.get('batch'))}: {_e(divergence['aligned'])} of "
                 f"{_e(divergence.get('computed'))} float tensors of the artifact matched with the source's</p>"]
        first = divergence.get("first")
        if first:
            rows = [[("fail", "first"), _e(first["node"]), _e(first["op_type"]), _e(first["module"]),
                     _e(first["source"]), _e(_g(first["introduced_max_abs"])), _e(_g(first["inherited_max_abs"])),
                     _e(", ".join(first["covers"]))]]
            rows += [["then", _e(step["node"]), _e(step["op_type"]), _e(step["module"]), _e(step["source"]),
                      _e(_g(step["introduced_max_abs"])), _e(_g(step["inherited_max_abs"])), ""]
                     for step in divergence.get("path", ())]
            parts.append(_table(["", "op", "type", "module", "source", "introduces", "receives", "covers"], rows))
        if divergence.get("profile"):
            parts.append(self.svg(_profile_plot(divergence)))
        return "".join(parts)

    @staticmethod
    def _dynamic(report: Report) -> str:
        rows = [[(_SIZE_STATUS_CLASS[d["status"]], _e(d["status"])), _e(d["input"]), _e(d["axis"]), _e(d["symbol"]),
                 _e(d["export_size"]), _e(", ".join(map(str, d["sizes"]))),
                 _e(f"{d['range'][0]}..{'' if d['range'][1] is None else d['range'][1]}"), _e(d["detail"])]
                for d in report.dynamic]
        parts = ["<h3>Dynamic axes</h3>", _table(["status", "input", "axis", "symbol", "export size", "sizes tried",
                                                  "range", "detail"], rows)]
        if report.dynamic_hints:
            parts.append("<p>Hints (the verdict comes from the runs):</p><ul>" + "".join(
                f"<li>{_e(h['message'])}</li>" for h in report.dynamic_hints) + "</ul>")
        return "".join(parts)

    @staticmethod
    def _measurement(measured: dict) -> str:
        """Latency by way of running and batch with its interval, memory, and the time by op type."""
        threads = measured["threads"] or f"the runtime's own ({measured['cpus']} CPUs)"
        facts = [("runtime", measured["runtime"]), ("threads", threads), ("load", f"{measured['load_seconds']:.3f} s"),
                 ("peak memory", f"{measured['peak_rss_mb']:.0f} MB ({measured['rss_before_load_mb']:.0f} MB before "
                                 "the load)"),
                 ("machine load", "{:.1f} then {:.1f}".format(*measured["load_average"])),
                 ("budgets", ", ".join(f"{k} {v}" for k, v in measured.get("budgets", {}).items()) or None)]
        against = measured.get("baseline_artifact")
        if against:
            facts.append(("baseline artifact", f"{against['path']}, peak memory {against['peak_rss_mb']:.0f} MB, "
                                               "measured in turn with this one"))
        rows = [[_e(artifact), _e(t["variant"]), _e(t["batch"]), _e(f"{t['median_ms']:.4g}"),
                 _e(f"[{t['low_ms']:.4g}, {t['high_ms']:.4g}]"), _e(f"{t['p90_ms']:.4g}"), _e(t["runs"]),
                 _e("" if t["items_per_second"] is None else f"{t['items_per_second']:.4g}")]
                for artifact, each in (("this", measured), ("baseline", against or {"timings": []}))
                for t in each["timings"]]
        parts = ["<h3>Cost</h3>", _table([], [[_e(k), f"<code>{_e(v)}</code>"] for k, v in facts if v is not None]),
                 _table(["artifact", "run", "batch", "median ms", "95% interval", "p90 ms", "runs", "items/s"], rows)]
        forms = gelu_form_rows(measured)
        if forms:
            parts.append("<p>GELU forms, measured in turn with the artifact (the way that ships, the batch given):</p>"
                         + _table(["form", "median ms", "95% interval", "ratio", "peak MB"], [
                             [_e(row["form"]), _e(f"{row['median_ms']:.4g}"),
                              _e(f"[{row['low_ms']:.4g}, {row['high_ms']:.4g}]"), _e(f"{row['ratio']:.2f}x"),
                              _e(f"{row['peak_rss_mb']:.0f}")] for row in forms]))
        for key, by, source in PROFILES:
            if measured.get(key):
                total = sum(measured[key].values())
                parts.append(f"<p>Time by {_e(by)} ({_e(source)}), per run:</p>" + _table(
                    [by, "ms", "share"], [[_e(name), _e(f"{ms:.4g}"), _e(f"{ms / total:.0%}")]
                                          for name, ms in list(measured[key].items())[:15]]))
        return "".join(parts)

    @staticmethod
    def _quantization(report: Report) -> str:
        q = report.quantization
        calibration = q.get("calibration") or {}
        facts = [("mode", q["mode"]), ("io", q.get("io")), ("method", q.get("method")),
                 ("calibration", f"{calibration['batches']} batch(es) from {calibration['source']}"
                  if calibration else None), ("float ops", len(q.get("float_ops", [])))]
        parts = ["<h3>Quantization</h3>", _table([], [[_e(k), f"<code>{_e(v)}</code>"] for k, v in facts
                                                     if v is not None])]
        if q.get("float_ops"):
            parts.append(_table(["float op", "op type", "tensor", "dtype"], [
                [_e(op["node"]), _e(op["op_type"]), _e(op["tensor"]), _e(op["dtype"])] for op in q["float_ops"]]))
        if q.get("layers"):
            first = (q.get("first_collapse") or {}).get("tensor")
            parts.append("<p>Layers, worst first (each int8 tensor against the float model's):</p>" + _table(
                ["tensor", "op type", "SQNR dB", ""], [
                    [_e(layer["tensor"]), _e(layer["op_type"]), _e(_g(layer["sqnr_db"])),
                     ("fail", "first to collapse") if layer["tensor"] == first else ""] for layer in q["layers"]]))
        return "".join(parts)

    def _gelu(self, report: Report) -> str:
        rows = []
        for g in report.gelu:
            deviation = g["residuals"].get(g["source_flavour"]) if g["source_flavour"] else None
            rows.append([(_STATUS_CLASS[g["status"]], _e(g["status"])),
                         _e(f"{g['source_site'] or '-'} ({g['source_flavour'] or '-'})"),
                         _e(f"{g['site'] or '-'} ({g['op'] or '-'})"), _e(g["measured"]),
                         _e(_g(deviation)), _e(g["message"])])
        parts = [f"<h3>GELU sites</h3><p>guard: {_e(report.gelu_guard)}</p>"]
        if rows:
            parts.append(_table(["status", "source site", "artifact site", "measured", "max deviation from the "
                                 "source's flavour", "message"], rows))
        parts += [self.svg(_site_plot(g)) for g in report.gelu if g.get("probes")]
        return "".join(parts)


def _g(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}"


def _histogram(name: str, result: OutputResult):
    from matplotlib.figure import Figure

    edges, counts = result.error_histogram["log10_edges"], result.error_histogram["counts"]
    labels = [f"<1e{edges[0]}"] + [f"1e{e}" for e in edges[:-1]] + [f"≥1e{edges[-1]}"]
    figure = Figure(figsize=(7, 2.4))
    axes = figure.subplots()
    axes.bar(range(len(counts)), counts, color="#3a6ea5")
    axes.set_xticks(range(len(counts)), labels, rotation=45, fontsize=7)
    if result.atol > 0:
        position = 1 + math.log10(result.atol) - edges[0]
        axes.axvline(position - 0.5, color="#b3261e", linestyle="--", label=f"atol {result.atol:g}")
        axes.legend(fontsize=7)
    axes.set_title(f"output {name}: elements by |artifact - source|", fontsize=9)
    axes.set_ylabel("elements", fontsize=8)
    return figure


def _by_sample_plot(output: dict):
    """An output's max abs error by sample (each point the worst of `samples_per_point`), log scale,
    against its atol."""
    from matplotlib.figure import Figure

    series = output["max_abs_by_sample"]
    per_point, points = series["samples_per_point"], series["points"]
    figure = Figure(figsize=(7, 2.4))
    axes = figure.subplots()
    floor = min([p for p in points if p > 0] or [1e-12]) / 10
    axes.plot([k * per_point for k in range(len(points))], [max(p, floor) for p in points], color="#3a6ea5",
              marker="." if len(points) < 200 else None, linewidth=0.8)
    axes.set_yscale("log")
    if output["atol"] > 0:
        axes.axhline(output["atol"], color="#b3261e", linestyle="--", label=f"atol {output['atol']:g}")
        axes.legend(fontsize=7)
    name = (output["variant"] + ": " if output["variant"] else "") + output["name"]
    axes.set_title(f"output {name}: max |artifact - source| by sample"
                   + (f" (worst of every {per_point})" if per_point > 1 else ""), fontsize=9)
    axes.set_xlabel("sample", fontsize=8)
    return figure


def _profile_plot(divergence: dict):
    """The error along the graph's order: at each aligned tensor, the artifact's error as it runs
    and the error its segment introduces when fed the source's values, against the tolerance;
    the first divergence marked."""
    from matplotlib.figure import Figure

    profile = divergence["profile"]
    order = [p["order"] for p in profile]
    floor = 1e-12
    figure = Figure(figsize=(9, 3))
    axes = figure.subplots()
    axes.semilogy(order, [max(p["max_abs"], floor) for p in profile], color="#3a6ea5", linewidth=1,
                  label="error as the artifact runs")
    axes.semilogy(order, [max(p["introduced_max_abs"], floor) for p in profile], ".", color="#1a1a1a", markersize=4,
                  label="error an op introduces (fed the source's values)")
    axes.semilogy(order, [max(p["tolerance"], floor) for p in profile], "--", color="#888", linewidth=0.8,
                  label="tolerance (float32 rounding)")
    first = divergence.get("first")
    if first:
        axes.axvline(first["index"], color="#b3261e", linewidth=1.2)
        axes.annotate(f"first divergence: {first['op_type']} in {first['module'] or '<root>'}",
                      (first["index"], max(first["introduced_max_abs"], floor)), fontsize=7, color="#b3261e",
                      xytext=(5, 5), textcoords="offset points")
    axes.set_xlabel("position in the artifact's graph", fontsize=8)
    axes.set_ylabel("max abs err", fontsize=8)
    axes.legend(fontsize=7, loc="lower right")
    axes.set_title("error along the graph", fontsize=9)
    return figure


def _site_plot(entry: dict):
    """The flavours on [-6, 6] with the artifact's probe values, and |value - flavour| per flavour."""
    import numpy as np
    from matplotlib.figure import Figure

    from verifiers.gelu.catalogue import FLAVOURS

    x = np.asarray(entry["probes"]["x"], dtype=float)
    y = np.asarray([np.nan if v is None else v for v in entry["probes"]["y"]], dtype=float)
    dense = np.linspace(-6, 6, 241)
    figure = Figure(figsize=(9, 3))
    curves, residuals = figure.subplots(1, 2)
    references = [f for f in FLAVOURS.values() if f.reference is not None and f.name != "identity"]
    for flavour in references:
        bold = flavour.name == entry["source_flavour"]
        curves.plot(dense, flavour.reference(dense), linewidth=2.2 if bold else 0.9,
                    label=flavour.name + (" (source)" if bold else ""))
        with np.errstate(all="ignore"):
            gap = np.abs(y - flavour.reference(x))
        residuals.semilogy(x, np.maximum(gap, 1e-12), marker=".", linewidth=2 if bold else 0.8, label=flavour.name)
    curves.plot(x, y, "k+", markersize=7, label="artifact")
    curves.set_xlim(-4, 4)
    curves.set_ylim(-0.5, 4)
    curves.legend(fontsize=7)
    curves.set_title(f"{entry['site'] or entry['source_site']}: {entry['status']} (measured {entry['measured']})",
                     fontsize=9)
    residuals.set_title("|artifact - flavour| on the probes", fontsize=9)
    residuals.legend(fontsize=7)
    return figure
