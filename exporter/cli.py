"""The `exportgate` command line: parse, call the API, print, exit with the report's code.

Exit codes: 0 pass, 1 outputs differ, 2 bad input or usage, 3 GELU changed, 4 target or opset
incompatible.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Optional

import typer

from verifiers.errors import ExportgateError, Terminated
from verifiers.quiet import hide_framework_logs, show_framework_output
from verifiers.report import LIST_CAP
from verifiers.writers import job_name

app = typer.Typer(
    name="exportgate",
    help="Export PyTorch and Keras models to ONNX or TFLite, and prove each artifact faithful before it ships.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# Reusable option groups (shared by export and verify).
InputOption = Annotated[list[str], typer.Option(
    "--input", metavar="NAME:SHAPE:DTYPE[:LOW..HIGH]",
    help="NAME:SHAPE:DTYPE[:LOW..HIGH], e.g. input_ids:2x16:int64:0..1000 (HIGH exclusive). Repeatable.")]
AtolOption = Annotated[list[str], typer.Option(
    "--atol", metavar="[NAME=]NUMBER",
    help="Absolute tolerance: a number for every output, or NAME=NUMBER for one. Repeatable.")]
RtolOption = Annotated[list[str], typer.Option(
    "--rtol", metavar="[NAME=]NUMBER",
    help="Relative tolerance: a number for every output, or NAME=NUMBER for one. Repeatable.")]
SeedOption = Annotated[int, typer.Option("--seed", metavar="N", help="Seed for the random verification batches.")]
BatchesOption = Annotated[int, typer.Option("--batches", metavar="N", min=0,
    help="Random batches besides the example inputs.")]
ReportOption = Annotated[Optional[Path], typer.Option("--report", metavar="PATH", help="Write the JSON report here.")]
JunitOption = Annotated[Optional[Path], typer.Option(
    "--junit", metavar="PATH",
    help="Write a JUnit XML report here: one test case per check (export, each output, each GELU "
    "site, each target check), for CI test views.")]
SummaryOption = Annotated[Optional[Path], typer.Option(
    "--summary", metavar="PATH",
    help="Write a Markdown summary here (verdict, the job, every failure). On GitHub Actions it is "
    "also appended to $GITHUB_STEP_SUMMARY.")]
HtmlOption = Annotated[Optional[Path], typer.Option(
    "--html", metavar="PATH",
    help="Write an HTML report here: one self-contained page with the verdict, the error histogram "
    "of each output and a plot of each GELU site against the flavours.")]
GeluGuardOption = Annotated[bool, typer.Option(
    "--no-gelu-guard", help="Do not check the GELU sites (the report records it). Without it, a source "
    "graph that cannot be read fails the run.")]
NonfiniteOption = Annotated[bool, typer.Option(
    "--allow-nonfinite", help="Accept NaN and Inf in the source's outputs where the artifact has the same value "
    "at the same position. Without it they fail the comparison.")]
TimeoutOption = Annotated[Optional[float], typer.Option(
    "--timeout", metavar="SECONDS", min=0.001,
    help="Seconds a runtime may take for one step on the artifact (a load, a batch, the "
    "GELU probes) before the run fails with exit 4. Default 900.")]
MemoryOption = Annotated[Optional[float], typer.Option(
    "--memory-limit", metavar="GIB", min=0.01,
    help="GiB of address space the runtime's worker process may use. Default: the "
    "machine's RAM.")]
TrustSourceOption = Annotated[bool, typer.Option(
    "--trust-source", help="Load a model file whose loading can run code it carries (a .pt2: torch.export.load "
    "unpickles; a .keras with a Lambda layer; a model folder's pickled weights or its own code). Without it such "
    "files are refused.")]
TaskOption = Annotated[Optional[str], typer.Option(
    "--task", metavar="TASK", help="A transformers model folder's task, e.g. text-classification (an unknown one "
    "lists them all). Default: the one its config's architecture does (a causal LM's: the one with past).")]


MatrixOption = Annotated[Optional[Path], typer.Option(
    "--matrix", metavar="FILE", help="A YAML file of targets that adds to or overrides opset_matrix.yaml.")]


LocalizeOption = Annotated[Optional[bool], typer.Option(
    "--localize/--no-localize", show_default=False,
    help="Find where the artifact first departs from the source: the op, its module and source line, and the "
    "error it introduces itself. Default: on a run whose outputs differ; --localize on a green run too.")]
MinSqnrOption = Annotated[Optional[float], typer.Option(
    "--min-sqnr", metavar="DB", help="int8 artifacts: the lowest SQNR in dB an output may have (default 20).")]
MinTop1Option = Annotated[Optional[float], typer.Option(
    "--min-top1", metavar="FRACTION", min=0.0, max=1.0,
    help="int8 artifacts: the lowest top-1 agreement with the source for outputs over classes (default 0.95).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")]
FullListsOption = Annotated[bool, typer.Option(
    "--full-lists", help=f"Keep every entry of the lists that grow with the model (ops computing in float, int8 "
    f"layers, the divergence profile) in the JSON report, not the first {LIST_CAP} and their count.")]
QuietOption = Annotated[bool, typer.Option("--quiet", help="No progress lines, only the verdict and failures.")]


class _StepLines:
    """A command's progress in a log: one `exportgate: HH:MM:SS step` line per step."""

    def __call__(self, message: str) -> None:
        typer.echo(f"exportgate: {time.strftime('%H:%M:%S')} {message}", err=True)


class _StepBar:
    """A command's progress on a terminal (rich): the current step, its elapsed time, and a bar
    for the batches and the GELU probes as they are counted."""

    def __init__(self, bar):
        self.bar = bar
        self.task = bar.add_task("starting", total=None)

    def __call__(self, message: str) -> None:
        self.bar.update(self.task, description=message, total=None, completed=0)

    def count(self, what: str, done: int, total: int) -> None:
        self.bar.update(self.task, total=total, completed=done)


@contextlib.contextmanager
def _command_progress(quiet: bool) -> Iterator:
    if quiet:
        yield lambda message: None
        return
    if not sys.stderr.isatty():
        yield _StepLines()
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("exportgate: {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        yield _StepBar(bar)


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Ctrl-C during a command: the API has cleaned up and written the report; say so in one
    line and exit 130 (click would print "Aborted!" and exit 1)."""
    try:
        yield
    except KeyboardInterrupt:
        typer.echo("exportgate: interrupted (SIGINT)", err=True)
        raise typer.Exit(130) from None


@contextlib.contextmanager
def _stdout_for_the_report() -> Iterator[None]:
    """While a command loads and runs the user's model, what it prints goes to stderr (Python's
    print) or where native writes to descriptor 2 go (its native writes to descriptor 1): stdout
    carries exportgate's report alone (--json)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _runtime_limits(timeout: float | None, memory_gib: float | None):
    """The limits of the runtime worker processes (verifiers.runtimes.isolation) for one command."""
    from verifiers.runtimes import isolation

    return isolation.limits(timeout, int(memory_gib * 2**30) if memory_gib else None)


def _reports(json_path: Path | None, junit_path: Path | None, html_path: Path | None,
             summary_path: Path | None) -> dict[str, Path]:
    """The report files asked for, by writer name (verifiers.writers)."""
    paths = {"json": json_path, "junit": junit_path, "html": html_path, "summary": summary_path}
    return {name: path for name, path in paths.items() if path is not None}


def _finish(report, as_json: bool = False) -> None:
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2, default=str))
    for finding in report.failures:  # EXPORTGATE_DEBUG=1
        if "traceback" in finding.data:
            typer.echo(finding.data["traceback"], err=True)
    for line in report.summary_lines():
        typer.echo(line, err=True)
    _tell_ci([(job_name(report), report)])
    raise typer.Exit(report.exit_code)


def _tell_ci(jobs) -> None:
    """On GitHub Actions: the Markdown summary appended to $GITHUB_STEP_SUMMARY, and one error
    annotation per failure (workflow commands, which the runner reads from stderr too)."""
    from verifiers.writers.markdown_summary import render

    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        try:
            with open(step_summary, "a", encoding="utf-8") as fh:
                fh.write(render(jobs))
        except OSError as exc:
            typer.echo(f"exportgate: could not append to $GITHUB_STEP_SUMMARY ({step_summary}): {exc}", err=True)
    if os.environ.get("GITHUB_ACTIONS") == "true":
        for name, report in jobs:
            for finding in report.failures:
                title = _workflow_escape(f"exportgate {finding.kind}: {name}", extra=":,")
                typer.echo(f"::error title={title}::{_workflow_escape(finding.message)}", err=True)


def _workflow_escape(text: str, extra: str = "") -> str:
    """Escape for a GitHub workflow command: % and line breaks always, : and , in a property."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return "".join({":": "%3A", ",": "%2C"}.get(c, c) if c in extra else c for c in text)


def _version(value: bool) -> None:
    if value:
        from importlib import metadata

        typer.echo(f"exportgate {metadata.version('exportgate')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print exportgate's version and exit.")] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", help="Let the frameworks' and runtimes' own start-up and log lines through.")] = False,
) -> None:
    """Export PyTorch and Keras models to ONNX or TFLite, and prove each artifact faithful before it ships."""
    if verbose:
        show_framework_output()
    else:
        hide_framework_chatter()


def hide_framework_chatter() -> None:
    """Keep what TensorFlow, absl, oneDNN, LiteRT and torchao print on their own (native log lines
    on file descriptor 2, log records at import) off the terminal: exportgate's own lines and
    Python's stderr go to the real stderr, native writes to descriptor 2 go to a scratch file."""
    import tempfile

    sys.stderr.flush()
    real = os.dup(2)
    scratch = tempfile.TemporaryFile()
    os.dup2(scratch.fileno(), 2)
    sys.stderr = os.fdopen(real, "w", buffering=1, encoding=sys.stderr.encoding, errors="backslashreplace")
    hide_framework_logs()


@app.command()
def export(
    model: Annotated[str, typer.Argument(metavar="MODEL",
    help="file.py:callable, model.keras, model.pt2 or a transformers "
                                              "model folder (save_pretrained)")],
    to: Annotated[str, typer.Option("--to", metavar="onnx|tflite", help="Artifact format: onnx or tflite.")],
    out: Annotated[Path, typer.Option("--out", metavar="PATH", help="Where the verified artifact goes.")],
    opset: Annotated[Optional[int], typer.Option("--opset", metavar="N",
    help="ONNX opset (default domain) to export at.")] = None,
    exporter: Annotated[str, typer.Option(
        "--exporter", metavar="NAME",
        help="auto, or force one: dynamo, torchscript (PyTorch -> ONNX), tf2onnx (Keras -> ONNX), "
        "tflite-converter (Keras -> TFLite), litert-torch (PyTorch -> TFLite).")] = "auto",
    quantize: Annotated[Optional[str], typer.Option(
        "--quantize", metavar="int8|fp16|dynamic-int8",
        help="int8 (full-integer post-training quantization, every route); TFLite also fp16 "
        "(float16 weights) or dynamic-int8 (dynamic-range int8).")] = None,
    io: Annotated[str, typer.Option(
        "--io", metavar="float|int8|uint8",
        help="With --quantize int8: the artifact's input and output types, float, int8 or uint8 (TFLite).")
    ] = "float",
    calibration: Annotated[Optional[str], typer.Option(
        "--calibration", metavar="DATA",
        help="With --quantize int8: calibration data, an .npz of arrays by input name, a folder of "
        ".npz/.npy files, or file.py:callable yielding feed dicts (default: seeded random batches).")] = None,
    allow_float_ops: Annotated[bool, typer.Option(
        "--allow-float-ops", help="With --quantize int8: let ops without an int8 kernel stay float (the report "
        "lists them) instead of failing.")] = False,
    target: Annotated[Optional[str], typer.Option(
        "--target", metavar="NAME",
        help="Export for this runtime or device (see `exportgate targets`), and check the artifact "
        "against it before writing it.")] = None,
    gelu: Annotated[str, typer.Option(
        "--gelu", metavar="preserve|tanh|native",
        help="preserve: each GELU keeps its flavour, in a form the target runs; tanh: write every GELU "
        "as tanh (declared); native: demand the native GELU op.")] = "preserve",
    matrix: MatrixOption = None,
    inputs: InputOption = [],
    dynamic: Annotated[list[str], typer.Option("--dynamic", metavar="NAME:AXIS[:MIN..MAX]",
    help="NAME:AXIS[:MIN..MAX]: make an input axis dynamic (verified at several sizes within MIN..MAX).")] = [],
    atol: AtolOption = [],
    rtol: RtolOption = [],
    seed: SeedOption = 0,
    batches: BatchesOption = 3,
    no_verify: Annotated[bool, typer.Option("--no-verify", help="Skip verification (the report says so).")] = False,
    no_gelu_guard: GeluGuardOption = False,
    allow_nonfinite: NonfiniteOption = False,
    min_sqnr: MinSqnrOption = None,
    min_top1: MinTop1Option = None,
    localize: LocalizeOption = None,
    trust_source: TrustSourceOption = False,
    task: TaskOption = None,
    timeout: TimeoutOption = None,
    memory_limit: MemoryOption = None,
    report: ReportOption = None,
    junit: JunitOption = None,
    html: HtmlOption = None,
    summary: SummaryOption = None,
    full_lists: FullListsOption = False,
    quiet: QuietOption = False,
    as_json: JsonOption = False,
) -> None:
    """Export MODEL, verify the artifact, and write it to --out only if it passes."""
    from exporter import api

    with _interruptible(), _stdout_for_the_report(), _runtime_limits(timeout, memory_limit), \
            _command_progress(quiet) as progress:
        result = api.export(
            model, to=to, out=out, opset=opset, exporter=exporter, quantize=quantize, io=io, calibration=calibration,
            allow_float_ops=allow_float_ops, target=target, gelu=gelu, matrix=matrix, inputs=inputs, dynamic=dynamic,
            atol=atol, rtol=rtol, min_sqnr=min_sqnr, min_top1=min_top1, localize=localize, seed=seed,
            batches=batches,
            verify=not no_verify, gelu_guard=not no_gelu_guard, allow_nonfinite=allow_nonfinite,
            trust_source=trust_source, task=task, full_lists=full_lists, reports=_reports(report, junit, html, summary),
            progress=progress,
        )
    _finish(result, as_json)


@app.command()
def verify(
    artifact: Annotated[Path, typer.Argument(metavar="ARTIFACT", help="The .onnx or .tflite artifact to check.")],
    source: Annotated[str, typer.Option("--source", metavar="MODEL",
    help="The source model: file.py:callable, .keras, .pt2 or a "
                                                          "transformers model folder.")],
    runtime: Annotated[Optional[str], typer.Option(
        "--runtime", metavar="NAME",
        help="The runtime to run ARTIFACT in (default: the one its format names: onnxruntime for "
        "ONNX, ai-edge-litert for TFLite).")] = None,
    inputs: InputOption = [],
    atol: AtolOption = [],
    rtol: RtolOption = [],
    seed: SeedOption = 0,
    batches: BatchesOption = 3,
    no_gelu_guard: GeluGuardOption = False,
    allow_nonfinite: NonfiniteOption = False,
    min_sqnr: MinSqnrOption = None,
    min_top1: MinTop1Option = None,
    localize: LocalizeOption = None,
    trust_source: TrustSourceOption = False,
    task: TaskOption = None,
    timeout: TimeoutOption = None,
    memory_limit: MemoryOption = None,
    report: ReportOption = None,
    junit: JunitOption = None,
    html: HtmlOption = None,
    summary: SummaryOption = None,
    full_lists: FullListsOption = False,
    quiet: QuietOption = False,
    as_json: JsonOption = False,
) -> None:
    """Run ARTIFACT and its source model on the same inputs and compare every output."""
    from exporter import api

    with _interruptible(), _stdout_for_the_report(), _runtime_limits(timeout, memory_limit), \
            _command_progress(quiet) as progress:
        result = api.verify(artifact, source=source, runtime=runtime, inputs=inputs, atol=atol, rtol=rtol, seed=seed,
                            batches=batches, gelu_guard=not no_gelu_guard, allow_nonfinite=allow_nonfinite,
                            min_sqnr=min_sqnr, min_top1=min_top1, localize=localize, task=task,
                            trust_source=trust_source, full_lists=full_lists,
                            reports=_reports(report, junit, html, summary), progress=progress)
    _finish(result, as_json)


@app.command()
def check(
    artifact: Annotated[Path, typer.Argument(metavar="ARTIFACT", help="The .onnx or .tflite artifact, from any tool.")],
    target: Annotated[str, typer.Option("--target", metavar="NAME",
    help="The runtime or device (see `exportgate targets`).")],
    matrix: MatrixOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    report: ReportOption = None,
    junit: JunitOption = None,
    html: HtmlOption = None,
    summary: SummaryOption = None,
    full_lists: FullListsOption = False,
) -> None:
    """List every incompatibility of ARTIFACT with a target: exit 4 when there is any, 0 when none."""
    from exporter.digests import hash_ahead

    hash_ahead(artifact)  # the report's SHA-256 is hashed while the rest imports and the check runs
    from exporter import api

    with _interruptible():
        result = api.check(artifact, target=target, matrix=matrix, full_lists=full_lists,
                           reports=_reports(report, junit, html, summary))
    _finish(result, as_json)


ConfigArgument = Annotated[Optional[Path], typer.Argument(
    metavar="[CONFIG]",
    help="The config: exportgate.toml (default), or a pyproject.toml with [tool.exportgate].")]


@app.command()
def run(
    config: ConfigArgument = None,
    out_dir: Annotated[Optional[Path], typer.Option(
        "--out-dir", metavar="DIR", help="Where each job's folder goes (OUT_DIR/MODEL/ARTIFACT). Default: the config's "
        "out_dir, else exportgate-out.")] = None,
    jobs: Annotated[Optional[int], typer.Option("--jobs", metavar="N", min=1,
    help="Jobs at a time. Default: the cores.")] = None,
    only: Annotated[list[str], typer.Option("--only", metavar="JOB",
    help="Run this job (MODEL/ARTIFACT). Repeatable.")] = [],
    shard: Annotated[Optional[str], typer.Option(
        "--shard", metavar="I/N", help="Run slice I of N (1-based) of the jobs, e.g. 2/4.")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Export every job, cached or not.")] = False,
    cache_dir: Annotated[Optional[Path], typer.Option(
        "--cache-dir", metavar="DIR", help="The cache of job results. Default: $XDG_CACHE_HOME/exportgate.")] = None,
    job_timeout: Annotated[Optional[float], typer.Option(
        "--job-timeout", metavar="SECONDS", min=0.001, help="Seconds a job may take; past them it fails.")] = None,
    timeout: TimeoutOption = None,
    memory_limit: MemoryOption = None,
    report: ReportOption = None,
    junit: JunitOption = None,
    html: HtmlOption = None,
    summary: SummaryOption = None,
    quiet: QuietOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the combined report as JSON on stdout.")] = False,
) -> None:
    """Run a config's jobs (models x artifacts), each exported and verified in a worker process."""
    from exporter import runs

    with _interruptible(), _job_progress(quiet) as progress:
        result = runs.run(config, out_dir=out_dir, workers=jobs, only=only, shard=shard, cache=not no_cache,
                          cache_dir=cache_dir, job_timeout=job_timeout, timeout=timeout, memory_limit=memory_limit,
                          reports=_reports(report, junit, html, summary), progress=progress)
    _finish_jobs(result, as_json, f"job folders in {result.out_dir}", {"--report": report, "--junit": junit,
                                                                       "--html": html, "--summary": summary})


@app.command()
def plan(
    config: ConfigArgument = None,
    fmt: Annotated[str, typer.Option(
        "--format", metavar="json|github|gitlab",
        help="json (the job ids), github (strategy.matrix: {include: [{job}]}) or gitlab "
        "(parallel:matrix with EXPORTGATE_JOB).")] = "json",
) -> None:
    """Print the config's job matrix as JSON, for a CI system to fan the jobs out."""
    from exporter import runs

    typer.echo(json.dumps(runs.plan(config, fmt)))


@app.command()
def merge(
    folders: Annotated[list[Path], typer.Argument(metavar="DIR...", help="Output folders of runs or shards (each holds "
                                                       "MODEL/ARTIFACT/report.json).")],
    report: ReportOption = None,
    junit: JunitOption = None,
    html: HtmlOption = None,
    summary: SummaryOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the combined report as JSON on stdout.")] = False,
) -> None:
    """Join the job reports of several runs (CI jobs) into one, with the combined exit code."""
    from exporter import runs

    with _interruptible():
        result = runs.merge(folders, reports=_reports(report, junit, html, summary))
    _finish_jobs(result, as_json, f"{len(result.jobs)} job report(s) from {len(folders)} folder(s)",
                 {"--report": report, "--junit": junit, "--html": html, "--summary": summary})


def _finish_jobs(result, as_json: bool, where: str, written: dict) -> None:
    if as_json:
        from verifiers.report import combined_exit_code

        code = combined_exit_code(r.exit_code for _, r in result.jobs)
        typer.echo(json.dumps({"verdict": "pass" if code == 0 else "fail", "exit_code": code,
                               "jobs": [{"job": name, **r.to_dict()} for name, r in result.jobs]},
                              indent=2, default=str))
    for line in result.summary_lines():
        typer.echo(line, err=True)
    files = ", ".join(f"{option} {path}" for option, path in written.items() if path is not None)
    typer.echo(f"{where}" + (f"; reports: {files}" if files else ""), err=True)
    _tell_ci(result.jobs)
    raise typer.Exit(result.exit_code)


@contextlib.contextmanager
def _job_progress(quiet: bool) -> Iterator:
    """What a run's jobs are doing: on a terminal a live table (rich: each running job's step and
    time, and a bar of the jobs done), else one timestamped line per step; nothing with --quiet."""
    if quiet:
        yield lambda job, message: None
        return
    if not sys.stderr.isatty():
        import datetime

        lock = threading.Lock()

        def line(job: str, message: str) -> None:
            with lock:
                stamp = datetime.datetime.now().strftime("%H:%M:%S")
                typer.echo(f"{stamp} {job}: {message}", err=True)

        yield line
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    done_words = ("pass (exit", "fail (exit", "reused from the cache")
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=False) as bar:
        overall = bar.add_task("jobs", total=None)
        rows: dict[str, int] = {}
        finished = 0

        def update(job: str, message: str) -> None:
            nonlocal finished
            if job not in rows:
                rows[job] = bar.add_task(f"{job}: {message}", total=1)
                bar.update(overall, total=len(rows))
            bar.update(rows[job], description=f"{job}: {message}")
            if message.startswith(done_words):
                bar.update(rows[job], completed=1)
                finished += 1
                bar.update(overall, completed=finished)

        yield update


@app.command()
def targets(
    matrix: MatrixOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """List the runtimes and devices exportgate knows, with what each supports."""
    from exporter import api
    from verifiers.formats import FORMATS

    entries = api.targets(matrix)
    if as_json:
        typer.echo(json.dumps(entries, indent=2))
        return
    for entry in entries:
        limit = FORMATS[entry["format"]].limit_text(entry)
        gelu = ", ".join(f"{flag} {'yes' if value else 'no'}" for flag, value in entry["gelu"].items()
                         if value is not None)
        confirmed = f"; tested here: {', '.join(entry['confirmed_by_test'])}" if entry["confirmed_by_test"] else ""
        typer.echo(f"{entry['name']}: {entry['format']}, {limit}; GELU: {gelu or 'no claim'}{confirmed}")


@app.command()
def inspect(
    artifact: Annotated[Path, typer.Argument(metavar="ARTIFACT", help="The artifact to describe.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
    timeout: TimeoutOption = None,
    memory_limit: MemoryOption = None,
) -> None:
    """Show an artifact's format, opsets, op counts, inputs and outputs, and its GELU sites."""
    from verifiers.runtimes.isolation import start_spare

    with _interruptible(), _runtime_limits(timeout, memory_limit):
        start_spare()  # the runtime worker that measures the GELU sites starts while the rest imports
        from exporter import api
        from verifiers.formats import FORMATS

        info = api.inspect(artifact)
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    for line in FORMATS[info["format"]].headline(info):
        typer.echo(line)
    for kind in ("inputs", "outputs"):
        typer.echo(f"{kind}:")
        for tensor in info[kind]:
            shape = f"[{', '.join(str(d) for d in tensor['shape'])}]" if tensor["shape"] else "scalar"
            dynamic = ", ".join(f"axis {d['axis']} ({d['symbol']})" for d in tensor.get("dynamic_axes", []))
            typer.echo(f"  {tensor['name']}: {shape} {tensor['dtype']}" + (f"; dynamic: {dynamic}" if dynamic else ""))
    versions = {op["op"]: op["version"] for op in info.get("ops", [])}
    typer.echo("ops:")
    for op, count in info["op_counts"].items():
        version = f" v{versions[op]}" if op in versions else ""
        typer.echo(f"  {op}{version}: {count}")
    if info.get("external_data"):
        typer.echo("external data: " + ", ".join(info["external_data"]))
    typer.echo(f"GELU sites: {len(info['gelu'])}")
    for site in info["gelu"]:
        residual = site["residuals"].get(site["measured"]) if site["measured"] else None
        measured = f"measured {site['measured']}" + (f" ({residual:.2g})" if residual is not None else "")
        if not site["confident"]:
            measured += ", inconclusive"
        typer.echo(f"  {site['site']}: {site['op']}, claimed {site['claimed']}, {measured}")


def _terminate(signum, frame) -> None:
    raise Terminated()


def main() -> None:
    """Entry point: every ExportgateError ends in one line and its exit code, never a traceback.
    Ctrl-C exits 130 and SIGTERM 143, each with one line, after the run has cleaned up and
    written its report."""
    signal.signal(signal.SIGTERM, _terminate)
    try:
        app(standalone_mode=True)
    except Terminated:
        typer.echo("exportgate: terminated (SIGTERM)", err=True)
        sys.exit(143)
    except ExportgateError as exc:
        from verifiers.report import EXIT_CODES

        if os.environ.get("EXPORTGATE_DEBUG"):
            import traceback

            traceback.print_exception(exc)
        typer.echo(f"exportgate: error: {exc}", err=True)
        sys.exit(EXIT_CODES.get(exc.kind, 2))
    except Exception as exc:  # the last guard: one line, and the traceback only on request
        if os.environ.get("EXPORTGATE_DEBUG"):
            raise
        from verifiers.errors import one_line

        typer.echo(f"exportgate: error: {one_line(exc)} (EXPORTGATE_DEBUG=1 shows the traceback)", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
