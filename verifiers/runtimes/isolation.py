"""Native runtimes run untrusted artifacts in a worker process, so a crash is a verdict.

onnxruntime and LiteRT are native code fed files nobody checked: a segfault, an abort or a hang
in them must end the step with a finding that names the runtime, the signal and the step, never a
dead or stuck exportgate. Every load and run of an artifact (the comparison's runner, the GELU
probes, the sensitivity run, inspect's measurements) goes through here:

  call(fn, *args, runtime=..., step=...)   fn(*args) in a fresh worker, its result returned
  IsolatedRunner(runner_class, model)       a Runner whose loads and runs happen in one worker
  start_early(runner_class)                 the next IsolatedRunner's worker, started now: it
                                            imports the runtime while the caller goes on
  ProbesInWorker(runner_class)              runner_class.run_probe in a worker: the caller reads
                                            the artifact and builds the probes
  start_spare()                             a worker for whichever runtime asks first, started
                                            before the command knows which (inspect's)

The worker is a fresh interpreter (no fork of a process holding torch or TensorFlow threads), with
an address-space limit (RLIMIT_AS) and a time limit per step; both come from `LIMITS`, which
the API sets from --timeout and --memory-limit. A crash or a timeout raises RuntimeCrashed
(finding kind "runtime", exit 4: the artifact does not run on this runtime). Errors the step
raises itself come back as they were.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import signal
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from verifiers.errors import ExportgateError, one_line
from verifiers.runtimes import InvalidArtifact, Runner, TensorInfo

if TYPE_CHECKING:  # arrays pass through; a worker imports numpy with its runtime, not before
    import numpy as np


def physical_memory() -> int:
    """Bytes of RAM on this machine (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


@dataclass(frozen=True)
class Limits:
    timeout: float = 900.0  # seconds per step (a load, one batch through every variant, a probe set)
    memory: int = 0  # bytes of address space for the worker; 0 is the machine's RAM
    threads: int = 0  # threads a runner may use for the artifact's runs; 0 leaves it to the runtime
    precision: str = ""  # the inference precision a runtime that picks one runs at ("" leaves it to the runtime)

    def memory_bytes(self) -> int:
        return self.memory or physical_memory()


LIMITS: contextvars.ContextVar[Limits] = contextvars.ContextVar("exportgate_runtime_limits", default=Limits())


@contextlib.contextmanager
def limits(timeout: float | None = None, memory_limit: float | None = None, threads: int | None = None,
           precision_hint: str | None = None):
    """Set the worker limits for the steps run inside: seconds per step, GiB of address space,
    threads for the artifact's runs, the inference precision a runtime that picks one runs at (the
    options --timeout, --memory-limit, --threads and --precision-hint; None keeps the default)."""
    given = {"timeout": timeout, "memory": None if memory_limit is None else int(memory_limit * 2**30),
             "threads": threads, "precision": precision_hint}
    token = LIMITS.set(Limits(**{name: value for name, value in given.items() if value is not None}))
    try:
        yield
    finally:
        LIMITS.reset(token)


class RuntimeCrashed(ExportgateError):
    """The runtime died (a signal), ran out of memory or time on the artifact: exit 4."""

    kind = "runtime"


class _Worker:
    """One worker interpreter serving requests over a socket until closed. It is started as
    `python -c` (not multiprocessing's spawn, which re-runs the parent's __main__: a user's script
    without a main guard would run again in the worker)."""

    def __init__(self, runtime: str):
        import socket
        import subprocess
        import sys
        from multiprocessing.connection import Connection

        self.runtime = runtime
        parent, child = socket.socketpair()
        limits = LIMITS.get()
        code = (f"from verifiers.runtimes.isolation import serve; "
                f"serve({child.fileno()}, {limits.memory_bytes()}, {limits.threads}, {limits.precision!r})")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = subprocess.Popen([sys.executable, "-c", code], pass_fds=[child.fileno()], env=env,
                                        stdin=subprocess.DEVNULL)
        child.close()
        self.conn = Connection(parent.detach())
        self.limits = LIMITS.get()
        # Requests sent ahead whose replies are not read yet: (step, future, when sent).
        self.pending: list[tuple[str, Future, float]] = []

    def send_ahead(self, step: str, *message) -> Future:
        """Send a request without waiting for it; its reply (or error) goes into the future returned,
        read before the next request's or by `settle`. Its time limit counts from now."""
        reply: Future = Future()
        try:
            self.conn.send(message)
        except OSError:
            reply.set_exception(self._died(step, timed_out=False, timeout=LIMITS.get().timeout))
            return reply
        self.pending.append((step, reply, time.monotonic()))
        return reply

    def settle(self) -> None:
        """Read the replies of every request sent ahead into their futures."""
        while self.pending:
            step, reply, sent = self.pending.pop(0)
            try:
                reply.set_result(self._reply(step, sent=sent))
            except Exception as exc:  # raised where the future is read
                reply.set_exception(exc)
            except BaseException as exc:  # an interrupt: it ends the wait too
                reply.set_exception(exc)
                raise

    def request(self, step: str, *message, on_progress: Callable[[int, int], None] | None = None) -> Any:
        """The reply to `message`; what the step reports of its progress on the way (see
        `report_progress`) goes to `on_progress(done, total)`."""
        self.settle()
        return self._reply(step, message, on_progress=on_progress)

    def _reply(self, step: str, message: tuple | None = None, sent: float | None = None,
               on_progress: Callable[[int, int], None] | None = None) -> Any:
        """The reply to `message`, sent first, or to a request sent ahead at `sent` when None."""
        timeout = LIMITS.get().timeout
        sent = time.monotonic() if sent is None else sent
        try:
            if message is not None:
                self.conn.send(message)
            while True:
                ready = self.conn.poll(max(0.0, timeout - (time.monotonic() - sent)))
                reply = self.conn.recv() if ready else None
                if reply is None or reply[0] != "progress":
                    break
                if on_progress is not None:
                    on_progress(*reply[1:])
        except (EOFError, OSError):
            ready, reply = True, None
        if reply is None:
            raise self._died(step, timed_out=not ready, timeout=timeout)
        status, value = reply
        if status == "error":
            raise value
        return value

    def alive(self) -> bool:
        return self.process.poll() is None

    def _died(self, step: str, timed_out: bool, timeout: float) -> RuntimeCrashed:
        if timed_out:
            self.close()
            return RuntimeCrashed(f"{self.runtime} did not finish {step} within {timeout:g} s (--timeout)")
        try:
            code = self.process.wait(5)
        except Exception:
            code = None
        self.close()
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return RuntimeCrashed(f"{self.runtime} crashed ({name}) while {step}")
        return RuntimeCrashed(f"{self.runtime} exited (code {code}) while {step}, out of memory or killed "
                              f"(--memory-limit {LIMITS.get().memory_bytes() / 2**30:.3g} GiB)")

    def dismiss(self) -> None:
        """Tell an idle worker to exit, without waiting for it (the runtime freeing its memory
        goes on beside whatever comes next); one with a request still running is closed."""
        if self.pending:
            self.close()
            return
        with contextlib.suppress(OSError):
            self.conn.send(("close",))
            self.conn.close()

    def close(self) -> None:
        """Tell the worker to exit and wait for it; kill it when it does not within a second."""
        with contextlib.suppress(OSError):
            self.conn.send(("close",))
        try:
            self.process.wait(1)
        except Exception:
            self.process.kill()
            with contextlib.suppress(Exception):
                self.process.wait(5)
        with contextlib.suppress(OSError):
            self.conn.close()


def serve(fd: int, memory: int, threads: int = 0, precision: str = "") -> None:
    """The worker: apply the memory limit and the runners' thread count and precision, then
    answer requests until told to close."""
    import resource
    from multiprocessing.connection import Connection

    from verifiers import runtimes

    conn = Connection(fd)
    global _TO_PARENT
    _TO_PARENT = conn
    if memory:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    runtimes.run_threads, runtimes.run_precision = threads, precision
    runner = None
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        op = message[0]
        if op == "close":
            return
        try:
            if op == "call":
                _, fn, args = message
                value = fn(*args)
            elif op == "open":
                _, runner_class, model = message
                try:
                    runner = runner_class(model)
                except (ExportgateError, MemoryError):
                    raise
                except Exception as exc:  # the runtime's own loader refused the file
                    raise InvalidArtifact(f"{_model_name(model)}: {runner_class.runtime} cannot load it: "
                                          f"{one_line(exc)}") from exc
                value = (runner.inputs, runner.outputs, runner.variants, dict(runner.arithmetic), list(runner.notes),
                         runner.precision)
            elif op == "run_each":
                value = runner.run_each(message[1])
            else:  # "run_all"
                value = runner.run_all(message[1])
            reply = ("ok", value)
        except MemoryError:
            reply = ("error", RuntimeCrashed(f"ran out of memory (--memory-limit {memory / 2**30:.3g} GiB)"))
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent, as it was
            reply = ("error", _portable(exc))
        try:
            conn.send(reply)
        except Exception as exc:  # a result or an error that does not pickle
            conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))


_TO_PARENT = None  # in a worker: the connection its replies go back on


def report_progress(done: int, total: int) -> None:
    """Code running in a worker says how far its step is (the GELU probes, site by site); the
    parent hands it to the request's on_progress. Outside a worker it does nothing."""
    if _TO_PARENT is not None:
        with contextlib.suppress(OSError):
            _TO_PARENT.send(("progress", done, total))


def counted(items: list):
    """The items, reporting the progress (report_progress) as each is done."""
    for done, item in enumerate(items, 1):
        yield item
        report_progress(done, len(items))


def _model_name(model: Path | bytes) -> str:
    return "<in-memory model>" if isinstance(model, (bytes, bytearray)) else str(model)


def _portable(exc: BaseException) -> BaseException:
    """The exception itself when it survives pickling, else its type and message."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        if isinstance(exc, ExportgateError):
            return ExportgateError(str(exc), kind=exc.kind)
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def call(fn: Callable, *args, runtime: str, step: str, runner: Runner | None = None,
         on_progress: Callable[[int, int], None] | None = None) -> Any:
    """fn(*args) in a worker: `runner`'s when it is an IsolatedRunner of that runtime, else a fresh
    one (fn and its arguments must pickle: a module-level function). What it reports of its
    progress goes to `on_progress(done, total)`."""
    if isinstance(runner, IsolatedRunner) and runner.runtime == runtime:
        return runner.call(fn, *args, step=step, on_progress=on_progress)
    worker = _Worker(runtime)
    try:
        return worker.request(step, "call", fn, args, on_progress=on_progress)
    finally:
        if worker.alive():
            worker.close()


_EARLY: dict[str, _Worker] = {}  # runtime -> a worker started ahead of its first load


def start_early(runner_class: type[Runner]) -> Callable[[], None]:
    """Start the worker the next IsolatedRunner of this runtime will load in, now, and have it
    import the runner's modules while the caller goes on (the start-up is then off the path to
    the first load); returns what closes it if no runner took it."""
    worker = _Worker(runner_class.runtime)
    worker.send_ahead(f"starting {runner_class.runtime}", "call", _import_runtime, (runner_class,))
    previous = _EARLY.pop(runner_class.runtime, None)
    if previous is not None:
        previous.close()
    _EARLY[runner_class.runtime] = worker

    def close_if_unused() -> None:
        if _EARLY.get(runner_class.runtime) is worker:
            del _EARLY[runner_class.runtime]
            worker.close()

    return close_if_unused


def _import_runtime(runner_class: type[Runner]) -> None:
    """In a worker: import what the runner's loads import (its class came with its module); what
    is missing is left for the load to report."""
    _import_modules(runner_class.imports)


def _import_modules(modules: tuple[str, ...]) -> None:
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            return


class ProbesInWorker:
    """`runner_class.run_probe` run in a runtime worker, while the caller reads the artifact and
    cuts the GELU probes out of it: a command that only measures GELU sites (inspect) runs no more
    than the probes in native code. A worker started ahead (start_spare, start_early) is taken at
    once and imports the runtime meanwhile; otherwise one starts with the first probe, so an
    artifact without GELU sites starts none. Passed where a runner class is
    (`Artifact.activation_sites(runner)`)."""

    def __init__(self, runner_class: type[Runner]):
        self.runner_class = runner_class
        self.runtime, self.formats = runner_class.runtime, runner_class.formats
        self._worker: _Worker | None = None
        if _SPARE or runner_class.runtime in _EARLY:
            self._start()

    def _start(self) -> _Worker:
        self._worker = _worker_for(self.runtime)
        self._worker.send_ahead(f"starting {self.runtime}", "call", _import_runtime, (self.runner_class,))
        return self._worker

    def run_probe(self, model: bytes, x: np.ndarray, variant: str | None = None) -> np.ndarray:
        worker = self._worker or self._start()
        return worker.request("running a GELU probe", "call", _run_probe, (self.runner_class, model, x, variant))

    def close(self) -> None:
        """Let the worker go (without waiting for it to exit)."""
        if self._worker is not None:
            self._worker.dismiss()

    def __enter__(self) -> ProbesInWorker:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _run_probe(runner_class: type[Runner], model: bytes, x: np.ndarray, variant: str | None) -> np.ndarray:
    return runner_class.run_probe(model, x, variant)


_SPARE: list[_Worker] = []  # a worker started before any runtime was named (start_spare)


def start_spare() -> None:
    """Start a worker now that the first runtime to need one and have none started early takes:
    a command that knows it will run a runtime but not yet which (inspect, before it has parsed its
    options or read the file) has the worker's start-up overlap its own. One left unclaimed is
    dismissed when the process ends."""
    import atexit

    if not _SPARE:
        spare = _Worker("a runtime")
        spare.send_ahead("starting", "call", _import_modules, (("numpy",),))  # what every runtime's arrays need
        _SPARE.append(spare)
        atexit.register(_dismiss_spare)


def _dismiss_spare() -> None:
    while _SPARE:
        _SPARE.pop().dismiss()


def _started_ahead(runtime: str):
    """The workers started ahead that `runtime` may take, each taken off its list as it is given:
    the one started early for it, then the spare."""
    if runtime in _EARLY:
        yield _EARLY.pop(runtime)
    if _SPARE:
        yield _SPARE.pop()


def _worker_for(runtime: str) -> _Worker:
    """The worker started early for `runtime` or the spare, when it is alive and under today's
    limits; else a new one."""
    for worker in _started_ahead(runtime):
        if worker.alive() and worker.limits == LIMITS.get():
            worker.runtime = runtime
            return worker
        worker.close()
    return _Worker(runtime)


class IsolatedRunner(Runner):
    """`runner_class(model)` living in a worker: the same inputs, outputs, variants and runs."""

    def __init__(self, runner_class: type[Runner], model: Path | bytes, wait: bool = True):
        """`wait` False: the load goes on in the worker while the caller does other work; the runner
        waits for it (and raises its error) when first used, or in `wait_loaded`."""
        self.formats, self.runtime = runner_class.formats, runner_class.runtime
        model = model if isinstance(model, (bytes, bytearray)) else Path(model)
        self._worker = _worker_for(runner_class.runtime)
        self._load = self._worker.send_ahead(f"loading {Path(_model_name(model)).name}", "open", runner_class, model)
        if wait:
            self.wait_loaded()

    def wait_loaded(self) -> IsolatedRunner:
        if not self._load.done():
            self._worker.settle()
        self._load.result()
        return self

    @property
    def inputs(self) -> list[TensorInfo]:
        return self.wait_loaded()._load.result()[0]

    @property
    def outputs(self) -> list[TensorInfo]:
        return self.wait_loaded()._load.result()[1]

    @property
    def variants(self) -> tuple[str, ...]:
        return self.wait_loaded()._load.result()[2]

    @property
    def arithmetic(self) -> dict[str, str]:
        return self.wait_loaded()._load.result()[3]

    @property
    def notes(self) -> list[str]:
        return self.wait_loaded()._load.result()[4]

    @property
    def precision(self) -> str:
        return self.wait_loaded()._load.result()[5]

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.run_all(feed)[self.variants[0]]

    def call(self, fn: Callable, *args, step: str, on_progress: Callable[[int, int], None] | None = None) -> Any:
        """fn(*args) in this runner's worker (saves starting another for the GELU probes)."""
        self.wait_loaded()
        return self._worker.request(step, "call", fn, args, on_progress=on_progress)

    def run_all(self, feed: dict[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
        self.wait_loaded()
        return self._worker.request("running the artifact", "run_all", feed)

    def run_each(self, feeds: dict[str, dict[str, np.ndarray]]) -> dict[str, list[np.ndarray]]:
        self.wait_loaded()
        return self._worker.request("running the artifact", "run_each", feeds)

    def close(self) -> None:
        self._worker.close()

    def __del__(self):
        worker = getattr(self, "_worker", None)
        if worker is not None and worker.alive():
            worker.dismiss()
