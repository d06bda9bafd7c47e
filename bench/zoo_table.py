"""Run every cell of the model zoo (fixtures/zoo.py) through exportgate and write the table of
results into docs/concepts.md, between the zoo-table markers.

    python bench/zoo_table.py

Each cell is one `exporter.api.export`: pass with the GELU sites kept, or the exit code and the
line that names what the exporter could not do.
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from exporter import api  # noqa: E402
from fixtures import zoo  # noqa: E402

PAGE = REPO / "docs" / "concepts.md"
BEGIN, END = "<!-- zoo-table:begin -->", "<!-- zoo-table:end -->"


def _cell_text(report) -> str:
    if report.exit_code == 0:
        kept = Counter(g["source_flavour"] for g in report.gelu if g["status"] == "kept")
        unused = sum(g["status"] == "unused" for g in report.gelu)
        gelu = ", ".join(f"{n} {flavour}" for flavour, n in sorted(kept.items())) or "no GELU"
        return f"pass: {gelu}" + (f", {unused} unused" if unused else "")
    message = report.failures[0].message if report.failures else ""
    short = re.sub(r"\s+", " ", message)[:90].replace("|", "/")
    return f"exit {report.exit_code}: {short}"


def run_zoo(progress) -> tuple[dict, float]:
    zoo.ensure_keras_hub()
    results: dict[tuple[str, str], dict[str, str]] = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
        for group, name, to, opset in zoo.cells():
            route = zoo.route_id(to, opset)
            progress(f"{name} -> {route}")
            report = api.export(zoo.spec(group, name), to=to, opset=opset, inputs=zoo.INPUTS.get((name, to), ()),
                                out=Path(tmp) / f"{name}-{route}.{to}")
            results.setdefault((group, name), {})[route] = _cell_text(report)
    return results, time.perf_counter() - start


def table(results: dict) -> str:
    routes = [zoo.route_id(to, opset) for to, opset in zoo.ROUTES]
    lines = ["| model | " + " | ".join(routes) + " |", "|---|" + "---|" * len(routes)]
    for (group, name), cells in results.items():
        lines.append(f"| {group} `{name}` | " + " | ".join(cells[r] for r in routes) + " |")
    total = sum(len(cells) for cells in results.values())
    passed = sum(text.startswith("pass") for cells in results.values() for text in cells.values())
    lines.append("")
    failed = total - passed
    lines.append(f"{len(results)} models, {total} cells: {passed} pass"
                 + (f", {failed} do not (each with the line that says why)." if failed else "."))
    return "\n".join(lines)


def main() -> int:
    results, seconds = run_zoo(lambda message: print(f"zoo: {message}", file=sys.stderr, flush=True))
    body = table(results)
    text = PAGE.read_text(encoding="utf-8")
    before, rest = text.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    new = f"{before}{BEGIN}\n{body}\n{END}{after}"
    PAGE.write_text(new, encoding="utf-8")
    print(f"zoo: {len(results)} models in {seconds:.0f} s; docs/concepts.md table written", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
