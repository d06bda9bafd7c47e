"""The README's two commands stay the ones CI and users run."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _commands():
    lines = (REPO / "README.md").read_text().splitlines()
    return [line.strip() for line in lines if line.startswith("    python3 -m venv")]


def test_readme_starts_with_the_demo_and_the_test_command():
    demo, tests = _commands()[:2]
    assert "exportgate export examples/mlp.py:build" in demo and "-c constraints.txt" in demo
    assert "pytest" in tests and "-c constraints.txt" in tests


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text()
    assert _commands()[1] in ci


def test_the_pipeline_guide_lists_every_job_option():
    import re

    from exporter.config import _OPTIONS

    text = " ".join((REPO / "docs" / "guides" / "release-pipeline.md").read_text().split())
    listed = re.search(r"A job's options are `export`'s \(([^)]*)\)", text)
    assert listed and set(re.findall(r"`(\w+)`", listed.group(1))) == set(_OPTIONS)
