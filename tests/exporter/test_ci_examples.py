"""The CI examples run on this machine the way the CI systems run them: the commands of
examples/ci/github-actions.yml (plan, one export job per matrix entry on a fresh copy, merge of
the uploaded folders) give the verdicts the example pipeline has (every job of the bundled MLP
passes with its GELUs kept), and those of examples/ci/gitlab-ci.yml (parallel shards, merge) the
same merged report as one local `exportgate run`. The slow suite's: each runs every job of the
example in CLI processes; by default tests/test_docs.py parses every command the examples run,
and tests/exporter/test_runs.py runs, reuses and merges jobs."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from junitparser import JUnitXml

from fixtures.children import REPO, child_env, run_child, run_cli

EXAMPLES = REPO / "examples"


def checkout(root: Path) -> Path:
    """A fresh runner's copy of the example pipeline; returns its working directory."""
    (root / "examples").mkdir(parents=True)
    shutil.copytree(EXAMPLES / "ci", root / "examples/ci")
    shutil.copy(EXAMPLES / "mlp.py", root / "examples/mlp.py")
    return root / "examples/ci"


def shell(command: str, cwd: Path, **env: str):
    environment = dict(PATH=f"{Path(sys.executable).parent}{os.pathsep}{child_env()['PATH']}",
                            XDG_CACHE_HOME=str(cwd / ".cache"), **env)
    return run_child(["bash", "-c", command], cwd=cwd, env=environment, timeout=1200)


def commands(steps: list[dict]) -> list[str]:
    """The shell commands of a job's steps, installs left out (this machine has exportgate)."""
    return [step["run"] for step in steps if "run" in step and not step["run"].startswith("pip install")]


def merged_jobs(path: Path) -> list[tuple[str, int, list[str]]]:
    report = json.loads(path.read_text())
    return [(job["job"], job["exit_code"], [g["status"] for g in job["gelu"]]) for job in report["jobs"]]


# examples/ci/exportgate.toml: the bundled MLP (two exact GELUs) x three artifacts, each faithful.
EXAMPLE_JOBS = [(job, 0, ["kept", "kept"]) for job in ("mlp/onnx17", "mlp/ort-1.16", "mlp/tflite")]


@pytest.fixture(scope="module")
def github_run(tmp_path_factory) -> Path:
    """The GitHub workflow's jobs run one after another: plan, one export per matrix entry on a
    fresh copy, its out folder uploaded and downloaded, then merge; returns the merge's working
    directory (its jobs/ are the downloads)."""
    workflow = yaml.safe_load((EXAMPLES / "ci/github-actions.yml").read_text())
    steps = {name: job["steps"] for name, job in workflow["jobs"].items()}
    root = tmp_path_factory.mktemp("github")
    plan_runner = checkout(root / "plan")
    outputs = plan_runner / "github_output"
    [plan] = commands(steps["plan"])
    assert shell(plan, plan_runner, GITHUB_OUTPUT=str(outputs)).returncode == 0
    name, _, value = outputs.read_text().strip().partition("=")
    assert name == "matrix"
    downloads = checkout(root / "merge") / "jobs"
    for index, entry in enumerate(json.loads(value)["include"]):
        runner = checkout(root / f"export-{index}")
        for command in commands(steps["export"]):
            result = shell(command.replace("${{ matrix.job }}", entry["job"]), runner)
            assert result.returncode == 0, result.stderr
        shutil.copytree(runner / "out", downloads / f"exportgate-job-{index}")  # upload, then download
    [merge] = commands(steps["merge"])
    result = shell(merge, downloads.parent)
    assert result.returncode == 0, result.stderr
    return downloads.parent


@pytest.mark.slow
def test_the_github_workflow_plans_exports_each_job_apart_and_merges(github_run):
    assert merged_jobs(github_run / "exportgate.json") == EXAMPLE_JOBS
    suites = [suite.name for suite in JUnitXml.fromfile(str(github_run / "exportgate.xml"))]
    assert suites == [job for job, _, _ in EXAMPLE_JOBS]
    assert (github_run / "exportgate.html").read_text().count("<svg") >= 3


@pytest.mark.slow
def test_the_gitlab_pipeline_runs_its_shards_and_merges_as_one_local_run(tmp_path):
    pipeline = yaml.safe_load((EXAMPLES / "ci/gitlab-ci.yml").read_text())

    def script(job: str) -> list[str]:
        """The job's before_script (its own, or the default) then its script, installs left out."""
        setup = pipeline[job].get("before_script", pipeline["default"]["before_script"])
        return [line for line in setup + pipeline[job]["script"] if not line.startswith("pip install")]

    shards = pipeline["export"]["parallel"]
    root = tmp_path / "project"
    checkout(root)
    for index in range(1, shards + 1):
        result = shell(" && ".join(script("export")), root, CI_NODE_INDEX=str(index), CI_NODE_TOTAL=str(shards))
        assert result.returncode == 0, result.stderr
    result = shell(" && ".join(script("merge")), root)
    assert result.returncode == 0, result.stderr
    local_run = checkout(tmp_path / "local")
    assert shell("exportgate run --report local.json", local_run).returncode == 0
    local = merged_jobs(local_run / "local.json")
    assert local == EXAMPLE_JOBS
    assert merged_jobs(root / "examples/ci/exportgate.json") == local
    junit = pipeline["merge"]["artifacts"]["reports"]["junit"]
    assert [suite.name for suite in JUnitXml.fromfile(str(root / junit))] == [job for job, _, _ in local]

NO_FRAMEWORK = "import sys; sys.modules.update(dict.fromkeys(('torch', 'tensorflow', 'keras', 'tf2onnx', 'ai_edge_litert'), None))"


@pytest.mark.slow
def test_plan_and_merge_jobs_install_no_framework_and_need_none(tmp_path, github_run):
    """The workflows install exportgate without extras where they only plan or merge: those
    commands run with every framework import refused."""
    workflow = yaml.safe_load((EXAMPLES / "ci/github-actions.yml").read_text())
    pipeline = yaml.safe_load((EXAMPLES / "ci/gitlab-ci.yml").read_text())
    for steps in ([step.get("run", "") for step in workflow["jobs"]["plan"]["steps"]],
                  [step.get("run", "") for step in workflow["jobs"]["merge"]["steps"]],
                  pipeline["merge"]["before_script"]):
        [install] = [line for line in steps if line.startswith("pip install")]
        assert "[" not in install, install
    plan = run_cli("plan", "--format", "github", cwd=github_run, prelude=NO_FRAMEWORK)
    assert plan.returncode == 0, plan.stderr
    assert [entry["job"] for entry in json.loads(plan.stdout)["include"]] == [job for job, _, _ in EXAMPLE_JOBS]
    merge = run_cli("merge", *sorted((github_run / "jobs").iterdir()), "--html", tmp_path / "merged.html",
                    "--junit", tmp_path / "merged.xml", "--report", tmp_path / "merged.json", cwd=tmp_path,
                    prelude=NO_FRAMEWORK)
    assert merge.returncode == 0, merge.stderr
    assert merged_jobs(tmp_path / "merged.json") == EXAMPLE_JOBS and "<svg" in (tmp_path / "merged.html").read_text()
