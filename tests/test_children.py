"""One way to start a child: every process the tests and their fixtures start goes through
fixtures/children.py, so each starts from the same clean environment whatever the shell or the
CI runner exports."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
THE_WAY = REPO / "fixtures" / "children.py"
# What starts a process besides fixtures.children: modules whose import alone says so, and calls.
STARTING_MODULES = {"subprocess", "multiprocessing", "concurrent.futures.process"}
STARTING_CALLS = {("os", name) for name in ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp",
                                             "execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp",
                                             "execlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl",
                                             "spawnle", "spawnlp", "spawnlpe")} | {("pty", "spawn"), ("pty", "fork")}


def _starts(path: Path) -> list[str]:
    """`line: what` for each way `path` has of starting a process."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name in STARTING_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module in STARTING_MODULES:
            found.append((node.lineno, f"from {node.module} import ..."))
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and (node.value.id, node.attr) in STARTING_CALLS):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_every_child_starts_through_fixtures_children():
    files = sorted({*(REPO / "tests").rglob("*.py"), *(REPO / "fixtures").rglob("*.py")} - {THE_WAY})
    assert [f"{path.relative_to(REPO)}:{start}" for path in files for start in _starts(path)] == []


def test_the_check_sees_a_child_started_another_way(tmp_path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("import os\nfrom subprocess import run\n\n\ndef go():\n    os.system('true')\n")
    assert _starts(sneaky) == ["2: from subprocess import ...", "6: os.system"]
