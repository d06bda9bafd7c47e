"""Every option of every command, declared once: its name (the API keyword and the config key),
flag, type, help, default, the commands that take it, and whether a config job may set it.

The CLI builds each command's parameters from here (exporter.cli), the API fills in defaults and
refuses unknown keywords with `given`, the config reads and checks job fields with `parse_field`,
a job's argv comes from `to_argv`, and the CLI reference (docs/cli.md) is written by
`reference_markdown` (a test keeps the committed page equal to it).

Where a value goes once parsed (`Option.to`):
  "api"      a keyword of the API call (exporter.api.export / verify / check)
  "report"   a report file: the CLI hands it to the API's `reports` by writer name
  "worker"   a setting of the runtime worker processes (verifiers.runtimes.isolation.limits)
  "cli"      how the CLI prints (--quiet, --json); the run command's own options
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verifiers.errors import BadInput
from verifiers.report import LIST_CAP
from verifiers.writers import WRITERS


@dataclass(frozen=True)
class Option:
    name: str  # the API keyword, the config key, the CLI parameter (negated: no_<name>)
    flag: str  # "--min-sqnr"; "--localize/--no-localize" for a switch with both forms; an argument's metavar
    type: type  # str, int, float, Path, bool or list (of str, repeatable)
    help: str
    commands: tuple[str, ...]
    default: Any = None
    metavar: str | None = None
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None
    job: bool = False  # a config job may set it (its key is `name`)
    negated: bool = False  # the flag turns `name` off ("--no-verify" sets verify False)
    argument: bool = False  # positional
    to: str = "api"
    expects: str | None = None  # what a config value must be, where the type does not say it well
    writer: str | None = None  # a report option: the report writer it asks for (verifiers.writers)
    # It names files the run reads (a path, or file.py:callable): a config resolves it against its
    # own folder, and what it names is part of a job's cache key (exporter.config).
    reads: bool = False

    @property
    def parameter(self) -> str:
        """The CLI function's parameter name."""
        return f"no_{self.name}" if self.negated else self.name

    @property
    def flags(self) -> list[str]:
        """The flags as a user types them: ["--localize", "--no-localize"], ["--no-verify"]."""
        return self.flag.split("/")

    def expectation(self) -> str:
        if self.expects:
            return self.expects
        if self.type is bool:
            return "true or false"
        if self.type is list:
            return f"{self.metavar} or a list of them"
        if self.type is int:
            return {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}[self.minimum]
        if self.type is float:
            low, high = self.minimum, self.maximum
            return f"a number from {low:g} to {high:g}" if low is not None and high is not None else "a number"
        return self.metavar or "a text"

    def parse_field(self, value: Any) -> Any:
        """A config field's value as the API takes it, or None when it is not what the option takes."""
        if self.type is bool:
            return value if isinstance(value, bool) else None
        if self.type is list:
            return as_strings(value)
        if self.type in (int, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    (self.type is int and not isinstance(value, int)):
                return None
            if (self.minimum is not None and value < self.minimum) or (self.maximum is not None and value > self.maximum):
                return None
            return self.type(value)
        return value if isinstance(value, str) and value else None

    def to_argv(self, value: Any) -> list[str]:
        """The command-line words that give `value`."""
        if self.type is bool:
            on, off = (self.flags + [None])[:2] if not self.negated else (None, self.flag)
            chosen = on if value else off
            return [chosen] if chosen else []
        if self.type is list:
            return [word for item in value for word in (self.flag, str(item))]
        return [self.flag, str(value)]


def as_strings(value: Any) -> list[str] | None:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return [str(value)]
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        return [str(v) for v in value]
    return None


_MODEL_SPEC = "file.py:callable, model.keras, model.pt2 or a transformers model folder (save_pretrained)"
_REPORTING = ("export", "verify", "check", "run", "merge", "measure")


def _report_option(writer: str) -> Option:
    """The option that asks for report writer `writer`, as the writer declares it (its OPTION and
    HELP); the JSON writer's is --report, named "report"."""
    module = WRITERS[writer]
    return Option(module.OPTION.removeprefix("--"), module.OPTION, Path, module.HELP, _REPORTING, metavar="PATH",
                  to="report", writer=writer)
_RUNNING = ("export", "verify")
_IN_A_WORKER = ("export", "verify", "run", "inspect", "measure")  # the commands that run a runtime worker

OPTIONS: tuple[Option, ...] = (
    # ---- what to export, and how ------------------------------------------------------------------
    Option("model", "MODEL", str, _MODEL_SPEC, ("export",), argument=True, required=True),
    Option("artifact", "ARTIFACT", Path, "The .onnx or .tflite artifact to check.", ("verify",), argument=True,
           required=True),
    Option("artifact", "ARTIFACT", Path, "The .onnx or .tflite artifact, from any tool.", ("check",), argument=True,
           required=True),
    Option("artifact", "ARTIFACT", Path, "The artifact to describe.", ("inspect",), argument=True, required=True),
    Option("artifact", "ARTIFACT", Path, "The .onnx or .tflite artifact to measure, from any tool.", ("measure",),
           argument=True, required=True),
    Option("source", "--source", str, "The source model: file.py:callable, .keras, .pt2 or a transformers model "
           "folder.", ("verify",), metavar="MODEL", required=True),
    Option("to", "--to", str, "Artifact format: onnx or tflite.", ("export",), metavar="onnx|tflite", required=True,
           job=True, expects="a format name"),
    Option("out", "--out", Path, "Where the verified artifact goes.", ("export",), metavar="PATH", required=True),
    Option("opset", "--opset", int, "ONNX opset (default domain) to export at.", ("export",), metavar="N", job=True,
           expects="a positive integer"),
    Option("exporter", "--exporter", str, "auto, or force one: dynamo, torchscript (PyTorch -> ONNX), tf2onnx "
           "(Keras -> ONNX), tflite-converter (Keras -> TFLite), litert-torch (PyTorch -> TFLite).", ("export",),
           default="auto", metavar="NAME", job=True, expects="an exporter name"),
    Option("quantize", "--quantize", str, "int8 (full-integer post-training quantization, every route); fp16 (ONNX: "
           "float16 compute, the ops whose measured values float16 cannot hold kept float32; TFLite: float16 "
           "weights); TFLite also dynamic-int8 (dynamic-range int8).", ("export",),
           metavar="int8|fp16|dynamic-int8", job=True, expects="int8, fp16 or dynamic-int8"),
    Option("io", "--io", str, "The artifact's input and output types: float; with --quantize int8, int8 or uint8 "
           "(TFLite); with --quantize fp16, float16 (ONNX).", ("export",), default="float",
           metavar="float|int8|uint8|float16", job=True, expects="float, int8, uint8 or float16"),
    Option("calibration", "--calibration", str, "With --quantize int8: calibration data; with --quantize fp16 (ONNX): "
           "the data whose values decide which ops stay float32. An .npz of arrays by input name, a folder of "
           ".npz/.npy files, or file.py:callable yielding feed dicts (default: --data's samples, else seeded random "
           "batches).", ("export",), metavar="DATA", job=True,
           expects="a path (.npz, a folder) or file.py:callable", reads=True),
    Option("keep_fp32", "--keep-fp32", list, "With --quantize fp16 (ONNX): keep this ONNX op type (Softmax) or the "
           "ops of this module (encoder.layer.0) in float32, besides those kept by measurement. Repeatable.",
           ("export",), default=(), metavar="OP_TYPE|MODULE", job=True),
    Option("allow_float_ops", "--allow-float-ops", bool, "With --quantize int8: let ops without an int8 kernel stay "
           "float (the report lists them) instead of failing.", ("export",), default=False, job=True),
    Option("target", "--target", str, "Export for this runtime or device (see `exportgate targets`), and check the "
           "artifact against it before writing it.", ("export",), metavar="NAME", job=True, expects="a target name"),
    Option("target", "--target", str, "The runtime or device (see `exportgate targets`).", ("check",),
           metavar="NAME", required=True),
    Option("gelu", "--gelu", str, "preserve: each GELU keeps its flavour, in a form the target runs; tanh: write "
           "every GELU as tanh (declared); native: demand the native GELU op.", ("export",), default="preserve",
           metavar="preserve|tanh|native", job=True, expects="preserve, tanh or native"),
    Option("matrix", "--matrix", Path, "A YAML file of targets that adds to or overrides opset_matrix.yaml.",
           ("export", "check", "targets"), metavar="FILE"),
    Option("runtime", "--runtime", str, "The runtime to run ARTIFACT in (default: the one its format names: "
           "onnxruntime for ONNX, ai-edge-litert for TFLite; openvino also runs ONNX).", ("verify", "measure"),
           metavar="NAME"),
    Option("inputs", "--input", list, "NAME:SHAPE:DTYPE[:LOW..HIGH], e.g. input_ids:2x16:int64:0..1000 (HIGH "
           "exclusive). Repeatable.", (*_RUNNING, "measure"), default=(), metavar="NAME:SHAPE:DTYPE[:LOW..HIGH]",
           job=True),
    Option("dynamic", "--dynamic", list, "NAME:AXIS[:MIN..MAX]: make an input axis dynamic (verified at several "
           "sizes within MIN..MAX).", ("export",), default=(), metavar="NAME:AXIS[:MIN..MAX]", job=True),
    Option("task", "--task", str, "A transformers model folder's task, e.g. text-classification (an unknown one lists "
           "them all). Default: the one its config's architecture does (a causal LM's: the one with past).",
           _RUNNING, metavar="TASK", job=True, expects="a task name (feature-extraction, text-generation, ...)"),
    Option("trust_source", "--trust-source", bool, "Load a model file whose loading can run code it carries (a .pt2: "
           "torch.export.load unpickles; a .keras with a Lambda layer; a model folder's pickled weights or its own "
           "code). Without it such files are refused.", _RUNNING, default=False, job=True),
    # ---- how it is verified -----------------------------------------------------------------------
    Option("atol", "--atol", list, "Absolute tolerance: a number for every output, or NAME=NUMBER for one. "
           "Repeatable.", _RUNNING, default=(), metavar="[NAME=]NUMBER", job=True,
           expects="a number, NAME=NUMBER or a list of them"),
    Option("rtol", "--rtol", list, "Relative tolerance: a number for every output, or NAME=NUMBER for one. "
           "Repeatable.", _RUNNING, default=(), metavar="[NAME=]NUMBER", job=True,
           expects="a number, NAME=NUMBER or a list of them"),
    Option("seed", "--seed", int, "Seed for the random verification batches.", _RUNNING, default=0, metavar="N",
           job=True),
    Option("seed", "--seed", int, "Seed for the random batch measured.", ("measure",), default=0, metavar="N"),
    Option("batches", "--batches", int, "Random batches besides the example inputs (default 3; none with --data).",
           _RUNNING, metavar="N", minimum=0, job=True),
    Option("data", "--data", str, "Verify on your own samples too: an .npz of arrays by input name (axis 0: samples), "
           "a folder of .npz/.npy files, or file.py:callable yielding feed dicts; streamed in batches of the "
           "model's batch size, with statistics per sample.", _RUNNING, metavar="DATA", job=True,
           expects="a path (.npz, a folder) or file.py:callable", reads=True),
    Option("data_cast", "--data-cast", bool, "Cast --data arrays to the inputs' dtypes within their kind (float64 to "
           "float32); without it another dtype is refused.", _RUNNING, default=False, job=True),
    Option("verify", "--no-verify", bool, "Skip verification (the report says so).", ("export",), default=True,
           negated=True, job=True),
    Option("gelu_guard", "--no-gelu-guard", bool, "Do not check the GELU sites (the report records it). Without it, a "
           "source graph that cannot be read fails the run.", _RUNNING, default=True, negated=True, job=True),
    Option("allow_nonfinite", "--allow-nonfinite", bool, "Accept NaN and Inf in the source's outputs where the "
           "artifact has the same value at the same position. Without it they fail the comparison.", _RUNNING,
           default=False, job=True),
    Option("min_sqnr", "--min-sqnr", float, "The lowest SQNR in dB an output may have: an int8 artifact's over all "
           "its batches or samples (default 20); on --data, a float artifact's worst sample's.", _RUNNING, metavar="DB",
           job=True, expects="a number (dB)"),
    Option("min_top1", "--min-top1", float, "The lowest top-1 agreement with the source for outputs over classes: an "
           "int8 artifact's (default 0.95); on --data, a float artifact's over the samples.", _RUNNING,
           metavar="FRACTION", minimum=0.0, maximum=1.0, job=True),
    Option("min_cosine", "--min-cosine", float, "On --data: the lowest cosine similarity with the source any sample's "
           "output may have.", _RUNNING, metavar="COSINE", minimum=-1.0, maximum=1.0, job=True),
    Option("localize", "--localize/--no-localize", bool, "Find where the artifact first departs from the source: the "
           "op, its module and source line, and the error it introduces itself. Default: on a run whose outputs "
           "differ; --localize on a green run too.", _RUNNING, job=True),
    Option("measure", "--measure", bool, "Measure what the artifact costs in its runtime once it is verified: load "
           "time, latency per batch (median, p90, 95% interval), throughput at the batch and at 4 times it, peak "
           "memory, each way the runtime runs it, in a fresh runtime worker.", _RUNNING, default=False, job=True),
    Option("measure_seconds", "--measure-seconds", float, "Seconds of timed runs at most per way of running and "
           "batch size (fewer once the median's 95% interval is within 2% of it). Default 3.",
           (*_RUNNING, "measure"), default=3.0, metavar="SECONDS", minimum=0.01, job=True),
    Option("max_latency", "--max-latency", float, "The most milliseconds one batch may take (the median of the way "
           "that ships, at the batch verified): over it, by the median's whole 95% interval, is exit 5. Measures.",
           (*_RUNNING, "measure"), metavar="MS", minimum=0.0, job=True),
    Option("max_memory", "--max-memory", float, "The most MB the runtime's worker may hold at its peak (the artifact "
           "loaded and run): over it is exit 5. Measures.", (*_RUNNING, "measure"), metavar="MB", minimum=0.0,
           job=True),
    Option("baseline", "--baseline", str, "A previous report with a measurement (--report of a run with --measure, "
           "or of `exportgate measure`): slower or bigger than it beyond --max-regression is exit 5. Measures.",
           (*_RUNNING, "measure"), metavar="REPORT.json", job=True, expects="a path", reads=True),
    Option("gelu_forms", "--gelu-forms", bool, "Measure the artifact's GELUs written in each other form it can take "
           "too (ONNX: Gelu ops or primitives, and ReLU as a yardstick; TFLite: primitives for the builtin), in turn "
           "with it: what --gelu would cost on this runtime.", ("measure",), default=False),
    Option("baseline_artifact", "--baseline-artifact", str, "The previous release's artifact, measured in this run "
           "in rounds taken in turn with this one (so both see the same machine): slower or bigger than it beyond "
           "--max-regression is exit 5. Measures.", (*_RUNNING, "measure"), metavar="PATH", job=True,
           expects="a path", reads=True),
    Option("max_regression", "--max-regression", float, "Percent the latency (beyond both 95% intervals) and the "
           "peak memory may grow over --baseline's or --baseline-artifact's. Default 10.", (*_RUNNING, "measure"),
           default=10.0, metavar="PERCENT", minimum=0.0, job=True),
    # ---- the runtime worker -----------------------------------------------------------------------
    Option("timeout", "--timeout", float, "Seconds a runtime may take for one step on the artifact (a load, a batch, "
           "the GELU probes) before the run fails with exit 4. Default 900.", _IN_A_WORKER,
           metavar="SECONDS", minimum=0.001, to="worker"),
    Option("memory_limit", "--memory-limit", float, "GiB of address space the runtime's worker process may use. "
           "Default: the machine's RAM.", _IN_A_WORKER, metavar="GIB", minimum=0.01,
           to="worker"),
    Option("threads", "--threads", int, "Threads the runtime may use to run the artifact (onnxruntime's intra-op "
           "threads, LiteRT's num_threads, OpenVINO's INFERENCE_NUM_THREADS). Default: the runtime's own choice.", _IN_A_WORKER,
           metavar="N", minimum=1, to="worker"),
    Option("precision_hint", "--precision-hint", str, "The inference precision a runtime that picks its own "
           "runs the artifact at (OpenVINO's INFERENCE_PRECISION_HINT: f32, bf16 or f16). Default: the runtime's "
           "choice on this CPU, which the report states.", ("verify", "measure"), metavar="PRECISION", to="worker"),
    # ---- what is written and printed --------------------------------------------------------------
    *(_report_option(writer) for writer in WRITERS),
    Option("full_lists", "--full-lists", bool, "Keep every entry of the lists that grow with the model (ops computing "
           f"in float, int8 layers, the divergence profile) in the JSON report, not the first {LIST_CAP} and their "
           "count.", ("export", "verify", "check"), default=False, job=True),
    Option("quiet", "--quiet", bool, "No progress lines, only the verdict and failures.",
           (*_RUNNING, "run", "measure"),
           default=False, to="cli"),
    Option("json", "--json", bool, "Print the report as JSON on stdout.", _REPORTING, default=False, to="cli"),
    Option("json", "--json", bool, "Print JSON instead of text.", ("targets", "inspect"), default=False, to="cli"),
    # ---- a release pipeline (exporter.runs) -------------------------------------------------------
    Option("config", "[CONFIG]", Path, "The config: exportgate.toml (default), or a pyproject.toml with "
           "[tool.exportgate].", ("run", "plan"), argument=True, to="cli"),
    Option("folders", "DIR...", list, "Output folders of runs or shards (each holds MODEL/ARTIFACT/report.json).",
           ("merge",), argument=True, required=True, to="cli"),
    Option("out_dir", "--out-dir", Path, "Where each job's folder goes (OUT_DIR/MODEL/ARTIFACT). Default: the "
           "config's out_dir, else exportgate-out.", ("run",), metavar="DIR", to="cli"),
    Option("jobs", "--jobs", int, "Jobs at a time. Default: the cores.", ("run",), metavar="N", minimum=1, to="cli"),
    Option("only", "--only", list, "Run this job (MODEL/ARTIFACT). Repeatable.", ("run",), default=(), metavar="JOB",
           to="cli"),
    Option("shard", "--shard", str, "Run slice I of N (1-based) of the jobs, e.g. 2/4.", ("run",), metavar="I/N",
           to="cli"),
    Option("cache", "--no-cache", bool, "Export every job, cached or not.", ("run",), default=True, negated=True,
           to="cli"),
    Option("cache_dir", "--cache-dir", Path, "The cache of job results. Default: $XDG_CACHE_HOME/exportgate.",
           ("run",), metavar="DIR", to="cli"),
    Option("job_timeout", "--job-timeout", float, "Seconds a job may take; past them it fails.", ("run",),
           metavar="SECONDS", minimum=0.001, to="cli"),
    Option("format", "--format", str, "json (the job ids), github (strategy.matrix: {include: [{job}]}) or gitlab "
           "(parallel:matrix with EXPORTGATE_JOB).", ("plan",), default="json", metavar="json|github|gitlab",
           to="cli"),
)

COMMANDS = ("export", "verify", "check", "run", "plan", "merge", "targets", "inspect", "measure")


def of(command: str) -> list[Option]:
    """The options `command` takes, in the order its help lists them."""
    return [option for option in OPTIONS if command in option.commands]


def job_options() -> dict[str, Option]:
    """The options a config job may set, by config key."""
    return {option.name: option for option in of("export") if option.job}


def given(command: str, values: dict[str, Any], to: str = "api") -> dict[str, Any]:
    """`values` (keywords of the API call, or the CLI's parsed parameters) completed with the
    defaults of `command`'s options that go `to` the API; an unknown keyword is a TypeError, as
    for any Python function."""
    declared = {option.name: option for option in of(command) if option.to == to and not option.argument}
    unknown = sorted(set(values) - set(declared))
    if unknown:
        raise TypeError(f"{command}() got an unexpected keyword argument {unknown[0]!r}")
    missing = [name for name, option in declared.items() if option.required and name not in values]
    if missing:
        raise TypeError(f"{command}() missing required keyword argument {missing[0]!r}")
    return {name: values.get(name, option.default) for name, option in declared.items()}


def flag_of(name: str, command: str = "export") -> str:
    """The flag a user types for option `name` of `command` (its messages name it so)."""
    for option in of(command):
        if option.name == name:
            return option.flags[0]
    raise KeyError(name)


def job_argv(options: dict[str, Any]) -> list[str]:
    """The `exportgate export` words that give a job's options (a config job's, validated)."""
    declared = job_options()
    words: list[str] = []
    for name, value in options.items():
        if name not in declared:
            raise BadInput(f"{name}: not an option a job may set")
        if value is not None:
            words += declared[name].to_argv(value)
    return words


def worker_argv(settings: dict[str, Any], command: str = "export") -> list[str]:
    """The words that hand the runtime worker's settings (--timeout, --memory-limit, ...) on."""
    declared = {option.name: option for option in of(command) if option.to == "worker"}
    return [word for name, value in settings.items() if value is not None for word in declared[name].to_argv(value)]


def reference_markdown() -> str:
    """The CLI reference: every command's arguments and options, from the declarations above."""
    lines = ["# CLI reference", "",
             "Made from the option declarations (`exporter/options.py`); `python -m exporter.options` prints it.",
             "A config job may set the options marked *job* (the key is the name in the second column), in",
             "`[defaults]`, a model's table, an artifact's table or a job's table (see",
             "[the release pipeline guide](guides/release-pipeline.md)).",
             ""]
    for command in COMMANDS:
        lines += [f"## exportgate {command}", "", "| option | name | value | default | |", "|---|---|---|---|---|"]
        for option in of(command):
            value = "" if option.type is bool else f"`{option.metavar or option.flag}`".replace("|", "\\|")
            default = "required" if option.required else "" if option.default in (None, (), False) or \
                option.type is bool else f"`{option.default}`"
            marks = ", ".join(filter(None, ["job" if option.job else "", "repeatable" if option.type is list
                                            and not option.argument else ""]))
            flag = option.flag if option.argument else " / ".join(f"`{f}`" for f in option.flags)
            text = option.help.replace("|", "\\|")
            lines.append(f"| {flag} | `{option.name}` | {value} | {default} | {text}{f' ({marks})' if marks else ''} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference_markdown(), end="")
