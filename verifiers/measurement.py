"""What an artifact costs where it runs: load time, latency per batch, throughput, peak memory.

`measure_artifact` runs in a fresh runtime worker (verifiers.runtimes.isolation.call), so the
memory it reports is the artifact's runtime alone: the worker's resident memory before the load
(the runtime imported) and its peak from there to the end of the runs (Linux's VmRSS and VmHWM,
the peak reset before the load). The load is the runner's: the file's checks and the runtime's
session or interpreter. Where the runtime has a profiler (onnxruntime), a few more runs say which
op types the time goes to, and which modules (by the scopes the exporter recorded, by_module). Each of the runtime's own ways of running it (onnxruntime's
session; LiteRT's XNNPACK and builtin interpreters; never an emulation such as the float16
variant, which says nothing of what ships) is timed at the batch given and, where every input's
first axis is dynamic, at a batch 4 times larger: warm-up runs first, then runs until the 95%
confidence interval of the median is within 2% of it, or the time given to it runs out. The
interval comes from order statistics (no assumption on the distribution of the times), and the
machine's load average before and after says how busy it was. Files measured in turn over several
rounds (a baseline artifact, GELU forms) are pooled, their interval the range of the rounds' medians.
"""

from __future__ import annotations

import importlib
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from verifiers.errors import BadInput, ExportgateError, one_line
from verifiers.quiet import native_output_captured

LARGER_BATCH = 4  # the larger batch, as a multiple of the one given
WARM_UP = 3
MIN_RUNS = 10
MAX_RUNS = 1000
PRECISION = 0.02  # the confidence interval's half-width wanted, as a fraction of the median
PROFILED_RUNS = 5
PROFILE_LINES = 5  # op types and modules the summary names
ROOT = "(no scope)"  # the profile's module for nodes the exporter put in no module
MADE_BY_RUNTIME = "(made by the runtime)"  # for nodes the runtime made and named anew
# The profiles a measurement holds: its key, what the time is by, and where that comes from.
PROFILES = (("profile", "op type", "the runtime's profiler"),
            ("profile_by_module", "module", "the scopes the exporter recorded"))
EMULATED = "float16"  # the variant that emulates float16 arithmetic: it says nothing of what ships


@dataclass(frozen=True)
class Timing:
    """One way of running the artifact at one batch size."""

    variant: str
    batch: int | None  # the first axis' size, None where the inputs have no batch axis
    runs: int
    median_ms: float
    p90_ms: float
    low_ms: float  # the 95% confidence interval of the median
    high_ms: float
    min_ms: float
    max_ms: float
    samples_ms: tuple[float, ...] = field(default=(), repr=False)  # each run's time (not in the report)

    @classmethod
    def of(cls, variant: str, batch: int | None, samples_ms: list[float]) -> Timing:
        """The statistics of `samples_ms`, one timed run each."""
        ms = np.array(samples_ms)
        low, high = median_interval(list(ms))
        return cls(variant, batch, len(ms), float(np.median(ms)), float(np.percentile(ms, 90)), low, high,
                   float(ms.min()), float(ms.max()), tuple(float(t) for t in ms))

    @property
    def items_per_second(self) -> float | None:
        return None if self.batch is None else self.batch / (self.median_ms / 1000)

    def to_dict(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "samples_ms"}, "items_per_second": self.items_per_second}


@dataclass
class Measurement:
    runtime: str
    threads: int | None  # as set (--threads); None: the runtime's own choice
    cpus: int  # the processors this process may run on
    load_seconds: float
    rss_before_load_mb: float
    peak_rss_mb: float
    load_average: tuple[float, float]  # the machine's 1-minute load average before and after
    timings: list[Timing] = field(default_factory=list)
    larger_batch: str | None = None  # why no larger batch was measured, when none was
    # Milliseconds per run by op type, from the runtime's own profiler, in the way that ships at the
    # batch given (empty where the runtime has no profiler to read: LiteRT's Python API), and the same
    # by the module (or name scope) the exporter recorded on the nodes (by_module).
    profile: dict[str, float] = field(default_factory=dict)
    profile_by_module: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "timings"},
                "timings": [t.to_dict() for t in self.timings]}


def pooled(rounds: list[Measurement]) -> Measurement:
    """One measurement of an artifact from several rounds of it, each in a fresh worker
    (alternating with another artifact's, so both see the same machine): each way of running and
    batch from all their runs, but its interval the range of the rounds' medians, since a worker's
    speed differs from the next one's by more than its runs differ among themselves (with 6
    rounds the range holds the median with 97% confidence: 1 - 2/2^6); the load time and the memory
    before it their medians, the peak memory the highest, the profile the mean, the machine's load
    before the first round and after the last."""
    first = rounds[0]
    samples: dict[tuple[str, int | None], list[float]] = {}
    medians: dict[tuple[str, int | None], list[float]] = {}
    for each in rounds:
        for timing in each.timings:
            samples.setdefault((timing.variant, timing.batch), []).extend(timing.samples_ms)
            medians.setdefault((timing.variant, timing.batch), []).append(timing.median_ms)
    profile, modules = (_mean([getattr(each, name) for each in rounds]) for name in ("profile", "profile_by_module"))
    return Measurement(first.runtime, first.threads, first.cpus,
                       float(np.median([each.load_seconds for each in rounds])),
                       float(np.median([each.rss_before_load_mb for each in rounds])),
                       max(each.peak_rss_mb for each in rounds),
                       (first.load_average[0], rounds[-1].load_average[1]),
                       [replace(Timing.of(variant, batch, times), low_ms=min(medians[variant, batch]),
                                high_ms=max(medians[variant, batch])) for (variant, batch), times in samples.items()],
                       first.larger_batch, profile, modules)


def _mean(profiles: list[dict[str, float]]) -> dict[str, float]:
    keys = {key for each in profiles for key in each}
    return _largest_first({key: sum(each.get(key, 0.0) for each in profiles) / len(profiles) for key in keys})


def summary_lines(measured: dict) -> list[str]:
    """The report's lines for a measurement (Measurement.to_dict)."""
    threads = (f"{measured['threads']} thread(s)" if measured["threads"]
               else f"its own thread count, {measured['cpus']} CPU(s)")
    before, after = measured["load_average"]
    lines = [f"  measured in {measured['runtime']} ({threads}): load {measured['load_seconds']:.2f} s, peak memory "
             f"{measured['peak_rss_mb']:.0f} MB ({measured['rss_before_load_mb']:.0f} MB before the load), machine "
             f"load {before:.1f} then {after:.1f}"]
    lines += [f"    {_timing_line(t)}" for t in measured["timings"]]
    against = measured.get("baseline_artifact")
    if against:
        lines.append(f"    baseline artifact {against['path']}, measured in turn with it: peak memory "
                     f"{against['peak_rss_mb']:.0f} MB")
        lines += [f"      {_timing_line(t)}" for t in against["timings"]]
    for row in gelu_form_rows(measured):
        if row["form"] == AS_GIVEN:
            lines.append(f"    GELU forms, measured in turn ({row['variant']}, batch {row['batch']}): as given "
                         f"{row['median_ms']:.3g} ms, peak memory {row['peak_rss_mb']:.0f} MB")
        else:
            lines.append(f"      {row['form']}: median {row['median_ms']:.3g} ms [{row['low_ms']:.3g}, "
                         f"{row['high_ms']:.3g}] ({row['ratio']:.2f}x), peak memory {row['peak_rss_mb']:.0f} MB")
    if measured["larger_batch"]:
        lines.append(f"    no larger batch: {measured['larger_batch']}")
    for key, by, source in PROFILES:
        if measured.get(key):
            total = sum(measured[key].values())
            top = list(measured[key].items())[:PROFILE_LINES]
            lines.append(f"    time by {by} ({source}): "
                         + ", ".join(f"{name} {ms:.3g} ms ({ms / total:.0%})" for name, ms in top))
    return lines


AS_GIVEN = "as given"


def gelu_form_rows(measured: dict) -> list[dict]:
    """The artifact and each GELU form measured with it (--gelu-forms), at the way that ships and
    the batch given: form, variant, batch, median and interval, ratio to the artifact's median,
    peak memory. Empty without GELU forms."""
    forms = measured.get("gelu_forms")
    if not forms:
        return []
    first = measured["timings"][0]
    rows = []
    for name, each in ((AS_GIVEN, measured), *((form["form"], form) for form in forms)):
        timing = next(t for t in each["timings"] if (t["variant"], t["batch"]) == (first["variant"], first["batch"]))
        rows.append({"form": name, "variant": first["variant"], "batch": first["batch"],
                     **{key: timing[key] for key in ("median_ms", "low_ms", "high_ms")},
                     "ratio": timing["median_ms"] / first["median_ms"], "peak_rss_mb": each["peak_rss_mb"]})
    return rows


def _timing_line(t: dict) -> str:
    rate = f", {t['items_per_second']:.3g} items/s" if t["items_per_second"] is not None else ""
    batch = t["batch"] if t["batch"] is not None else "-"
    return (f"{t['variant']}, batch {batch}: median {t['median_ms']:.3g} ms [{t['low_ms']:.3g}, {t['high_ms']:.3g}] "
            f"(95%), p90 {t['p90_ms']:.3g} ms, {t['runs']} runs{rate}")


def median_interval(times: list[float]) -> tuple[float, float]:
    """The 95% confidence interval of the median of `times` from their order statistics: the
    ranks n/2 -+ 0.98 sqrt(n) (the normal approximation of the binomial count of values below it)."""
    ordered = sorted(times)
    n = len(ordered)
    half = 0.98 * math.sqrt(n)
    low = max(0, math.floor(n / 2 - half))
    high = min(n - 1, math.ceil(n / 2 + half))
    return ordered[low], ordered[high]


def time_runs(run, seconds: float) -> list[float]:
    """Seconds of each timed call of `run()`, after the warm-up: until the median's interval is
    within PRECISION of it (MIN_RUNS at least), or `seconds` have passed, or MAX_RUNS."""
    for _ in range(WARM_UP):
        run()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < MAX_RUNS:
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
        if len(times) >= MIN_RUNS:
            low, high = median_interval(times)
            if (high - low) / 2 <= PRECISION * float(np.median(times)) or time.perf_counter() - start >= seconds:
                break
    return times


def larger(feed: dict[str, np.ndarray], inputs: list, factor: int) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """The feed `factor` times larger along every input's first axis, or None and why not."""
    from verifiers.sizes import is_dynamic

    fixed = [info.name for info in inputs if not info.shape or not is_dynamic(info.shape[0])]
    if fixed:
        return None, f"input {fixed[0]} has no dynamic first axis"
    return {name: np.concatenate([value] * factor, axis=0) for name, value in feed.items()}, None


def measure_artifact(runner_class, model: Path, feed: dict[str, np.ndarray], seconds: float,
                     scopes: dict[str, str]) -> Measurement:
    """Load `model` with `runner_class` in this process (a fresh runtime worker) and time its runs
    on `feed` (under the artifact's input names) and on a larger batch; see the module's docstring.
    `scopes`: the module of each of its nodes, for the profile by module (by_module)."""
    from verifiers import runtimes

    for module in runner_class.imports:  # the runtime imported first: its import is not the artifact's load
        importlib.import_module(module)
    load_before = os.getloadavg()[0]
    rss_before = _resident_mb("VmRSS")
    _reset_peak()
    began = time.perf_counter()
    runner = runner_class(model)
    load_seconds = time.perf_counter() - began
    names = sorted(info.name for info in runner.inputs)
    if names != sorted(feed):
        raise BadInput(f"{model.name}: its inputs are {', '.join(names)}, not {', '.join(sorted(feed))} as the "
                       "batch measured: measure it on its own (exportgate measure) or give an artifact of these inputs")
    variants = [variant for variant in runner.variants if variant != EMULATED]
    refused = _refusal(runner.timed_call(variants[0], feed))
    if refused:
        shapes = ", ".join(f"{name} {'x'.join(map(str, value.shape)) or 'scalar'}" for name, value in feed.items())
        raise BadInput(f"{model.name} does not run on the batch measured ({shapes}): {refused}; give each "
                       "input's shape and range with --input NAME:SHAPE:DTYPE[:LOW..HIGH]")
    feeds = {_batch(feed): feed}
    bigger, why = larger(feed, runner.inputs, LARGER_BATCH)
    if bigger is not None:
        refused = _refusal(runner.timed_call(variants[0], bigger))
        if refused:
            why = f"it does not run at batch {_batch(bigger)} ({refused})"
        else:
            feeds[_batch(bigger)] = bigger
    timings = []
    for variant in variants:
        for batch, each in feeds.items():
            with native_output_captured():  # once around the runs, not in each
                times = time_runs(runner.timed_call(variant, each), seconds)
            timings.append(Timing.of(variant, batch, [t * 1000 for t in times]))
    peak = _resident_mb("VmHWM")  # before the profiler's own session
    nodes = runner.profile(feed, PROFILED_RUNS)
    by_op: dict[str, float] = {}
    for (_, op_type), ms in nodes.items():
        by_op[op_type] = by_op.get(op_type, 0.0) + ms
    return Measurement(runner_class.runtime, runtimes.run_threads or None, len(os.sched_getaffinity(0)),
                       load_seconds, rss_before, peak, (load_before, os.getloadavg()[0]), timings, why,
                       _largest_first(by_op), _largest_first(by_module(nodes, scopes)) if nodes else {})


def by_module(nodes: dict[tuple[str, str], float], scopes: dict[str, str]) -> dict[str, float]:
    """The profile's milliseconds per run (by node name and op type) summed by module: `scopes`
    gives each of the artifact's nodes the module or name scope its exporter recorded (ROOT for
    none); a node the runtime made by fusing keeps the name of the node it starts from
    (onnxruntime's optimizer names them so), and one named anew is counted under MADE_BY_RUNTIME."""
    ordered = sorted(scopes, key=len, reverse=True)  # the longest name a fused node's name starts with
    found: dict[str, float] = {}
    for (name, _), ms in nodes.items():
        scope = scopes.get(name) or next((scopes[known] for known in ordered if name.startswith(known)),
                                         MADE_BY_RUNTIME)
        found[scope] = found.get(scope, 0.0) + ms
    return found


def _largest_first(times: dict[str, float]) -> dict[str, float]:
    return dict(sorted(times.items(), key=lambda item: -item[1]))


def _refusal(run) -> str | None:
    """What the runtime said when `run()` failed (the values or shapes are not ones the model
    takes), in one line; None when it ran."""
    try:
        run()
    except ExportgateError:
        raise
    except Exception as exc:  # the runtime's own error
        return one_line(exc)
    return None


def _resident_mb(field: str) -> float:
    """This process's resident memory (VmRSS) or its peak (VmHWM, since the last _reset_peak), in MB,
    from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise OSError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    """Start the peak resident memory (VmHWM) from the current one (Linux 4.0 and later)."""
    Path("/proc/self/clear_refs").write_text("5")


def _batch(feed: dict[str, np.ndarray]) -> int | None:
    sizes = {value.shape[0] for value in feed.values() if np.ndim(value)}
    return sizes.pop() if len(sizes) == 1 else None


@dataclass(frozen=True)
class Overrun:
    """A budget the measurement exceeds, or a regression against the baseline: the metric, the
    figure measured, the limit, and (against a baseline) the baseline's figure."""

    metric: str  # "latency" (ms, the shipped way's median at the batch given) or "peak memory" (MB)
    measured: float
    limit: float
    baseline: float | None = None
    grew: tuple[tuple[str, float], ...] = ()  # op types whose time grew most: (op type, ms more per run)
    grew_in: tuple[tuple[str, float], ...] = ()  # the same by module (Measurement.profile_by_module)

    @property
    def message(self) -> str:
        unit = "ms" if self.metric == "latency" else "MB"
        if self.baseline is None:
            return (f"{self.metric} {self.measured:.4g} {unit} is over the budget of {self.limit:.4g} {unit} "
                    f"({self.measured / self.limit:.2f}x)")
        grew = ("; grew most: " + ", ".join(f"{op} +{ms:.3g} ms" for op, ms in self.grew)) if self.grew else ""
        if self.grew_in:
            grew += "; in: " + ", ".join(f"{module} +{ms:.3g} ms" for module, ms in self.grew_in)
        return (f"{self.metric} {self.measured:.4g} {unit} against the baseline's {self.baseline:.4g} {unit} "
                f"({self.measured / self.baseline:.2f}x, more than the {self.limit:.4g} {unit} allowed){grew}")


def overruns(measured: dict, max_latency: float | None, max_memory: float | None, baseline: dict | None,
             max_regression: float) -> tuple[list[Overrun], list[str]]:
    """The budgets `measured` (Measurement.to_dict) exceeds, and notes where the noise or the
    baseline cannot tell. Latency is the first way of running (the one that ships) at the batch
    given: over a budget only when its whole 95% interval is, slower than the baseline's only when
    the interval's low end passes the baseline's high end by more than `max_regression` (a
    fraction). Peak memory is one figure each: over when it is over."""
    found, notes = [], []
    first = measured["timings"][0]
    if max_latency is not None:
        if first["low_ms"] > max_latency:
            found.append(Overrun("latency", first["median_ms"], max_latency))
        elif first["high_ms"] > max_latency:
            notes.append(f"latency: median {first['median_ms']:.4g} ms, 95% interval [{first['low_ms']:.4g}, "
                         f"{first['high_ms']:.4g}] ms around the budget of {max_latency:g} ms: not over it at this "
                         "noise (run where the machine is quieter, or give --measure-seconds more)")
    if max_memory is not None and measured["peak_rss_mb"] > max_memory:
        found.append(Overrun("peak memory", measured["peak_rss_mb"], max_memory))
    if baseline:
        regressions, said = _against(measured, baseline, max_regression)
        found += regressions
        notes += said
    return found, notes


def _against(measured: dict, baseline: dict, max_regression: float) -> tuple[list[Overrun], list[str]]:
    notes = []
    for key in ("runtime", "threads", "cpus"):
        if measured[key] != baseline.get(key):
            notes.append(f"baseline: measured with {key} {baseline.get(key)}, this run with {measured[key]}")
    first = measured["timings"][0]
    same = next((t for t in baseline.get("timings", ()) if (t["variant"], t["batch"]) == (first["variant"],
                                                                                         first["batch"])), None)
    found = []
    if same is None:
        notes.append(f"baseline: no {first['variant']} timing at batch {first['batch']} to compare with")
    else:
        allowed = same["high_ms"] * (1 + max_regression)
        if first["low_ms"] > allowed:
            found.append(Overrun("latency", first["median_ms"], allowed, same["median_ms"],
                                 _grew(measured.get("profile", {}), baseline.get("profile", {})),
                                 _grew(measured.get("profile_by_module", {}), baseline.get("profile_by_module", {}))))
        elif first["median_ms"] > same["median_ms"] * (1 + max_regression):
            notes.append(f"latency: median {first['median_ms']:.4g} ms against the baseline's {same['median_ms']:.4g} "
                         "ms, but their 95% intervals do not say it is slower beyond the regression allowed")
    if "peak_rss_mb" in baseline and measured["peak_rss_mb"] > baseline["peak_rss_mb"] * (1 + max_regression):
        found.append(Overrun("peak memory", measured["peak_rss_mb"], baseline["peak_rss_mb"] * (1 + max_regression),
                             baseline["peak_rss_mb"]))
    return found, notes


def _grew(profile: dict, before: dict, top: int = 3) -> tuple[tuple[str, float], ...]:
    """The op types (or modules) whose time per run grew most from `before` to `profile` ({op type:
    ms per run})."""
    grown = sorted(((op, ms - before.get(op, 0.0)) for op, ms in profile.items()), key=lambda item: -item[1])
    return tuple((op, ms) for op, ms in grown[:top] if ms > 0)
