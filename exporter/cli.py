"""The `exportgate` command line: parse, call the API, print, exit with the report's code.

Exit codes: 0 pass, 1 outputs differ, 2 bad input or usage, 3 GELU changed, 4 target or opset
incompatible.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from inspect import Parameter, Signature
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from exporter import options
from exporter.options import Option
from verifiers.errors import ExportgateError, Terminated
from verifiers.quiet import hide_framework_logs, show_framework_output
from verifiers.writers import job_name, option_of

app = typer.Typer(
    name="exportgate",
    help="Export PyTorch and Keras models to ONNX or TFLite, and prove each artifact faithful before it ships.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _parameter(option: Option) -> Parameter:
    """A typer parameter made from an option's declaration (exporter.options)."""
    if option.argument:
        info = typer.Argument(metavar=option.flag, help=option.help, show_default=False)
    else:
        bounds = {key: value for key, value in (("min", option.minimum), ("max", option.maximum)) if value is not None}
        info = typer.Option(option.flag, metavar=option.metavar, help=option.help,
                            show_default=option.type is not bool and option.default not in (None, ()), **bounds)
    if option.type is bool:
        kind, default = (bool, False) if option.negated else (Optional[bool] if option.default is None else bool,
                                                                option.default)
    elif option.type is list:
        kind, default = list[str], [] if not option.required else Parameter.empty
    else:
        kind = option.type if option.required else Optional[option.type]
        default = Parameter.empty if option.required else option.default
    return Parameter(option.parameter, Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, info])


def _command(body: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """Register `body` as the command of its name, its parameters those the declarations give it;
    it is called with the parsed values by option name (a --no-X switch already turned into X)."""
    declared = options.of(body.__name__)

    def command(**values: Any) -> None:
        body({option.name: (not values[option.parameter]) if option.negated else values[option.parameter]
              for option in declared})

    parameters = [_parameter(option) for option in declared]
    command.__signature__ = Signature(parameters)
    command.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
    command.__doc__ = body.__doc__
    app.command(body.__name__)(command)
    return body


def _api_keywords(command: str, values: dict[str, Any]) -> dict[str, Any]:
    """The values of `command`'s options that are keywords of its API call."""
    return {option.name: values[option.name] for option in options.of(command) if option.to == "api"}


def _reports(command: str, values: dict[str, Any]) -> dict[str, Path]:
    """The report files asked for, by writer name (verifiers.writers)."""
    return {option.writer: values[option.name]
            for option in options.of(command) if option.to == "report" and values[option.name] is not None}


def _worker(command: str, values: dict[str, Any]) -> dict[str, Any]:
    """The runtime worker's settings given to `command` (--timeout, --memory-limit, ...)."""
    return {option.name: values[option.name] for option in options.of(command) if option.to == "worker"}


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


def _runtime_limits(command: str, values: dict[str, Any]):
    """The settings of the runtime worker processes (verifiers.runtimes.isolation) for one command."""
    from verifiers.runtimes import isolation

    return isolation.limits(**_worker(command, values))


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
    Python's stderr go to the real stderr, native writes to descriptor 2 go to a scratch file. A
    Python stderr that is not descriptor 2 (a host running the CLI in its own process) stays."""
    import tempfile

    sys.stderr.flush()
    real = os.dup(2)
    scratch = tempfile.TemporaryFile()
    os.dup2(scratch.fileno(), 2)
    if _on_descriptor(sys.stderr, 2):
        sys.stderr = os.fdopen(real, "w", buffering=1, encoding=sys.stderr.encoding, errors="backslashreplace")
    else:
        os.close(real)
    hide_framework_logs()


def _on_descriptor(stream, fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except (AttributeError, OSError, ValueError):  # a stream of the host's own, with no descriptor
        return False


@_command
def export(values: dict[str, Any]) -> None:
    """Export MODEL, verify the artifact, and write it to --out only if it passes."""
    _run_and_finish("export", values)


@_command
def verify(values: dict[str, Any]) -> None:
    """Run ARTIFACT and its source model on the same inputs and compare every output."""
    _run_and_finish("verify", values)


def _run_and_finish(command: str, values: dict[str, Any]) -> None:
    """export or verify through the API (what the model prints kept off stdout, under the runtime
    worker's settings, progress on stderr), then the verdict and the exit code."""
    from exporter import api

    with _interruptible(), _stdout_for_the_report(), _runtime_limits(command, values), \
            _command_progress(values["quiet"]) as progress:
        result = getattr(api, command)(**_api_keywords(command, values), reports=_reports(command, values),
                                       progress=progress)
    _finish(result, values["json"])


@_command
def measure(values: dict[str, Any]) -> None:
    """Measure what ARTIFACT costs in its runtime: load time, latency, throughput, peak memory."""
    _run_and_finish("measure", values)


@_command
def check(values: dict[str, Any]) -> None:
    """List every incompatibility of ARTIFACT with a target: exit 4 when there is any, 0 when none."""
    from exporter.digests import hash_ahead

    hash_ahead(values["artifact"])  # the report's SHA-256 is hashed while the rest imports and the check runs
    from exporter import api

    with _interruptible():
        result = api.check(**_api_keywords("check", values), reports=_reports("check", values))
    _finish(result, values["json"])


@_command
def run(values: dict[str, Any]) -> None:
    """Run a config's jobs (models x artifacts), each exported and verified in a worker process."""
    from exporter import runs

    reports = _reports("run", values)
    with _interruptible(), _job_progress(values["quiet"]) as progress:
        result = runs.run(values["config"], out_dir=values["out_dir"], workers=values["jobs"], only=values["only"],
                          shard=values["shard"], cache=values["cache"], cache_dir=values["cache_dir"],
                          job_timeout=values["job_timeout"], worker=_worker("run", values), reports=reports,
                          progress=progress)
    _finish_jobs(result, values["json"], f"job folders in {result.out_dir}", reports)


@_command
def plan(values: dict[str, Any]) -> None:
    """Print the config's job matrix as JSON, for a CI system to fan the jobs out."""
    from exporter import runs

    typer.echo(json.dumps(runs.plan(values["config"], values["format"])))


@_command
def merge(values: dict[str, Any]) -> None:
    """Join the job reports of several runs (CI jobs) into one, with the combined exit code."""
    from exporter import runs

    folders = [Path(folder) for folder in values["folders"]]
    reports = _reports("merge", values)
    with _interruptible():
        result = runs.merge(folders, reports=reports)
    _finish_jobs(result, values["json"], f"{len(result.jobs)} job report(s) from {len(folders)} folder(s)", reports)


def _finish_jobs(result, as_json: bool, where: str, written: dict) -> None:
    if as_json:
        from verifiers.report import combined_exit_code

        code = combined_exit_code(r.exit_code for _, r in result.jobs)
        typer.echo(json.dumps({"verdict": "pass" if code == 0 else "fail", "exit_code": code,
                               "jobs": [{"job": name, **r.to_dict()} for name, r in result.jobs]},
                              indent=2, default=str))
    for line in result.summary_lines():
        typer.echo(line, err=True)
    files = ", ".join(f"{option_of(writer)} {path}" for writer, path in written.items())
    typer.echo(f"{where}" + (f"; reports: {files}" if files else ""), err=True)
    _tell_ci(result.jobs)
    raise typer.Exit(result.exit_code)


@contextlib.contextmanager
def _job_progress(quiet: bool) -> Iterator:
    """What a run's jobs are doing: on a terminal a live table (rich: each running job's step and
    time, and a bar of the jobs done), else one timestamped line per step; nothing with --quiet."""
    if quiet:
        yield lambda job, message, done=False: None
        return
    if not sys.stderr.isatty():
        import datetime

        lock = threading.Lock()

        def line(job: str, message: str, done: bool = False) -> None:
            with lock:
                stamp = datetime.datetime.now().strftime("%H:%M:%S")
                typer.echo(f"{stamp} {job}: {message}", err=True)

        yield line
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=False) as bar:
        overall = bar.add_task("jobs", total=None)
        rows: dict[str, int] = {}
        finished = 0

        def update(job: str, message: str, done: bool = False) -> None:
            nonlocal finished
            if job not in rows:
                rows[job] = bar.add_task(f"{job}: {message}", total=1)
                bar.update(overall, total=len(rows))
            bar.update(rows[job], description=f"{job}: {message}")
            if done:
                bar.update(rows[job], completed=1)
                finished += 1
                bar.update(overall, completed=finished)

        yield update


@_command
def targets(values: dict[str, Any]) -> None:
    """List the runtimes and devices exportgate knows, with what each supports."""
    from exporter import api
    from verifiers.formats import FORMATS

    entries = api.targets(values["matrix"])
    if values["json"]:
        typer.echo(json.dumps(entries, indent=2))
        return
    for entry in entries:
        limit = FORMATS[entry["format"]].limit_text(entry)
        gelu = ", ".join(f"{flag} {'yes' if value else 'no'}" for flag, value in entry["gelu"].items()
                         if value is not None)
        confirmed = f"; tested here: {', '.join(entry['confirmed_by_test'])}" if entry["confirmed_by_test"] else ""
        float16 = f"; float16 computes in {entry['float16']}" if entry["float16"] else ""
        typer.echo(f"{entry['name']}: {entry['format']}, {limit}; GELU: {gelu or 'no claim'}{float16}{confirmed}")


@_command
def inspect(values: dict[str, Any]) -> None:
    """Show an artifact's format, opsets, op counts, inputs and outputs, and its GELU sites."""
    from verifiers.runtimes.isolation import start_spare

    with _interruptible(), _runtime_limits("inspect", values):
        start_spare()  # the runtime worker that measures the GELU sites starts while the rest imports
        from exporter import api
        from verifiers.formats import FORMATS

        info = api.inspect(values["artifact"])
    if values["json"]:
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


def console_main() -> None:
    """The `exportgate` command (pyproject's script): main(), then the process ends once its work is
    written. Threads that are not daemons are joined, exit handlers run (a spare worker dismissed,
    temporary folders removed, logging flushed) and the output flushed, but the interpreter's
    teardown of every object (0.7 s after a BERT-base verify, changing nothing on disk) is skipped.
    main() is for a caller in the same interpreter: it raises SystemExit and leaves it be."""
    try:
        main()
        code = 0
    except SystemExit as exit_:
        if isinstance(exit_.code, int) or exit_.code is None:
            code = exit_.code or 0
        else:  # as Python's own exit does with a message
            print(exit_.code, file=sys.stderr)
            code = 1
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # what interpreter shutdown would run first
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (exportgate ... | head)
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    console_main()
