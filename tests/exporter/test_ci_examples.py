"""The CI examples run on this machine the way the CI systems run them: the commands of
examples/ci/github-actions.yml (plan, one export job per matrix entry on a fresh copy, merge of
the uploaded folders) and of examples/ci/gitlab-ci.yml (parallel shards, merge) give the same
merged report as one local `exportgate run`."""

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


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> Path:
    """The example pipeline run on one machine; returns its working directory."""
    cwd = checkout(tmp_path_factory.mktemp("local"))
    result = shell("exportgate run --report local.json", cwd)
    assert result.returncode == 0, result.stderr
    return cwd


@pytest.fixture(scope="module")
def local(local_run):
    return merged_jobs(local_run / "local.json")


def test_the_github_workflow_plans_exports_each_job_apart_and_merges(tmp_path, local):
    workflow = yaml.safe_load((EXAMPLES / "ci/github-actions.yml").read_text())
    steps = {name: job["steps"] for name, job in workflow["jobs"].items()}
    plan_runner = checkout(tmp_path / "plan")
    outputs = plan_runner / "github_output"
    [plan] = commands(steps["plan"])
    assert shell(plan, plan_runner, GITHUB_OUTPUT=str(outputs)).returncode == 0
    name, _, value = outputs.read_text().strip().partition("=")
    matrix = json.loads(value)
    assert name == "matrix" and [entry["job"] for entry in matrix["include"]] == [job for job, _, _ in local]

    downloads = checkout(tmp_path / "merge") / "jobs"
    for index, entry in enumerate(matrix["include"]):
        runner = checkout(tmp_path / f"export-{index}")
        for command in commands(steps["export"]):
            result = shell(command.replace("${{ matrix.job }}", entry["job"]), runner)
            assert result.returncode == 0, result.stderr
        shutil.copytree(runner / "out", downloads / f"exportgate-job-{index}")  # upload, then download
    [merge] = commands(steps["merge"])
    result = shell(merge, downloads.parent)
    assert result.returncode == 0, result.stderr
    assert merged_jobs(downloads.parent / "exportgate.json") == local
    suites = [suite.name for suite in JUnitXml.fromfile(str(downloads.parent / "exportgate.xml"))]
    assert suites == [job for job, _, _ in local]
    assert (downloads.parent / "exportgate.html").read_text().count("<svg") >= 3


@pytest.mark.slow  # the GitHub workflow runs the same jobs, one per matrix entry, in the default suite
def test_the_gitlab_pipeline_runs_its_shards_and_merges(tmp_path, local):
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
    assert merged_jobs(root / "examples/ci/exportgate.json") == local
    junit = pipeline["merge"]["artifacts"]["reports"]["junit"]
    assert [suite.name for suite in JUnitXml.fromfile(str(root / junit))] == [job for job, _, _ in local]

NO_FRAMEWORK = "import sys; sys.modules.update(dict.fromkeys(('torch', 'tensorflow', 'keras', 'tf2onnx', 'ai_edge_litert'), None))"


def test_plan_and_merge_jobs_install_no_framework_and_need_none(tmp_path, local_run, local):
    """The workflows install exportgate without extras where they only plan or merge: those
    commands run with every framework import refused."""
    workflow = yaml.safe_load((EXAMPLES / "ci/github-actions.yml").read_text())
    pipeline = yaml.safe_load((EXAMPLES / "ci/gitlab-ci.yml").read_text())
    for steps in ([step.get("run", "") for step in workflow["jobs"]["plan"]["steps"]],
                  [step.get("run", "") for step in workflow["jobs"]["merge"]["steps"]],
                  pipeline["merge"]["before_script"]):
        [install] = [line for line in steps if line.startswith("pip install")]
        assert "[" not in install, install
    plan = run_cli("plan", "--format", "github", cwd=local_run, prelude=NO_FRAMEWORK)
    assert plan.returncode == 0, plan.stderr
    assert [entry["job"] for entry in json.loads(plan.stdout)["include"]] == [job for job, _, _ in local]
    merge = run_cli("merge", local_run / "out", "--html", tmp_path / "merged.html", "--junit", tmp_path / "merged.xml",
                    "--report", tmp_path / "merged.json", cwd=tmp_path, prelude=NO_FRAMEWORK)
    assert merge.returncode == 0, merge.stderr
    assert merged_jobs(tmp_path / "merged.json") == local and "<svg" in (tmp_path / "merged.html").read_text()
