"""Run exportgate and its hand-written equivalent alternately, several rounds, and compare.

Each command runs as its own process; wall time is measured around it. Peak RSS is the peak of
the resident sets of the process and all its descendants added up (sampled every 20 ms from
/proc: exportgate's runtime worker runs beside it), and never below the largest single process's
peak (os.wait4). Prints min and median of each and the ratios exportgate / hand-written.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXPORTGATE = [sys.executable, "-c", "from exporter.cli import console_main; console_main()"]


@dataclass
class Runs:
    name: str
    walls: list[float] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)  # GB


def run_once(command: list[str], cwd: Path, expect: int = 0) -> tuple[float, float]:
    """(wall seconds, peak RSS of the process tree in GB) of one run; raises when it does not exit
    with `expect`."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = [0]
    sampler = threading.Thread(target=_sample_tree_rss, args=(process, peak), daemon=True)
    sampler.start()
    stderr = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    sampler.join()
    code = os.waitstatus_to_exitcode(status)
    if code != expect:
        raise SystemExit(f"{' '.join(command)} failed with exit {code}:\n{stderr.decode()[-3000:]}")
    return wall, max(peak[0], usage.ru_maxrss * 1024) / 1e9  # ru_maxrss is in KiB on Linux


def _sample_tree_rss(process: subprocess.Popen, peak: list[int]) -> None:
    """Every 20 ms until `process` ends: the resident bytes of it and its descendants, added up."""
    while process.returncode is None and Path(f"/proc/{process.pid}").exists():
        peak[0] = max(peak[0], sum(_rss(pid) for pid in _tree(process.pid)))
        time.sleep(0.02)


def _tree(root: int) -> list[int]:
    pids, queue = [], [root]
    while queue:
        pid = queue.pop()
        pids.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            try:
                queue.extend(int(child) for child in task.read_text().split())
            except OSError:
                pass
    return pids


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def compare(pairs: list[tuple[str, list[str], str, list[str]]], rounds: int, cwd: Path,
            goals: dict[str, tuple[float, float]] | None = None, expect: int = 0) -> None:
    """For each (label, exportgate command, label, hand-written command): `rounds` alternating
    runs, each expected to exit with `expect`."""
    for gate_name, gate, hand_name, hand in pairs:
        a, b = Runs(gate_name), Runs(hand_name)
        for i in range(rounds):
            for runs, command in ((a, gate), (b, hand)):
                wall, rss = run_once(command, cwd, expect)
                runs.walls.append(wall)
                runs.rss.append(rss)
                print(f"  round {i + 1}: {runs.name}: {wall:.2f} s, {rss:.2f} GB", file=sys.stderr, flush=True)
        print(f"{'':40} {'wall min':>9} {'median':>8} {'RSS max':>8}")
        for runs in (a, b):
            print(f"{runs.name:40} {min(runs.walls):8.2f}s {statistics.median(runs.walls):7.2f}s "
                  f"{max(runs.rss):7.2f}G")
        wall_ratio = min(a.walls) / min(b.walls)
        rss_ratio = max(a.rss) / max(b.rss)
        goal = (goals or {}).get(gate_name)
        verdict = ""
        if goal:
            verdict = (f"   goal wall <= {goal[0]:.2f}x, RSS <= {goal[1]:.2f}x: "
                       f"{'met' if wall_ratio <= goal[0] and rss_ratio <= goal[1] else 'NOT met'}")
        print(f"{'ratio (min wall, max RSS)':40} {wall_ratio:8.2f}x {'':8} {rss_ratio:7.2f}x{verdict}\n", flush=True)


TORCH_ONNX = "exportgate export --to onnx --opset 17"


def torch_onnx_pair(model: str, folder: str, name: str, *options: str) -> tuple[str, list[str], str, list[str]]:
    """`exportgate export MODEL --to onnx --opset 17` beside bench/handwritten/torch_to_onnx.py."""
    return (TORCH_ONNX,
            [*EXPORTGATE, "export", model, "--to", "onnx", "--opset", "17", *options, "--out", f"{folder}/gate/{name}"],
            "hand-written torch.onnx + ORT",
            [sys.executable, str(REPO / "bench/handwritten/torch_to_onnx.py"), model, f"{folder}/{name}"])
