"""Release pipelines: a config of models x artifacts run as jobs, cached, planned for a CI matrix,
run in shards and merged; the reports read back with junitparser."""

import json
from pathlib import Path

import pytest
import torch
from junitparser import Failure, JUnitXml

from exporter import runs
from exporter.digests import sha256
from fixtures.models.hf_models import __file__ as HF_MODELS
from fixtures.specs import KERAS_MODELS, TORCH_MODELS
from verifiers.errors import BadInput

FAST_CONFIG = f"""
[defaults]
batches = 2

[models.mlp]
spec = "{TORCH_MODELS}:mlp_exact"

[models.branch]
spec = "{TORCH_MODELS}:sign_branch"  # traced on one branch, the batches take the other: exit 1

[artifacts.onnx17]
to = "onnx"
opset = 17

[artifacts."ort-1.16"]
to = "onnx"
target = "ort-1.16"
"""


def write_config(folder, text, name="exportgate.toml"):
    path = folder / name
    path.write_text(text)
    return path


def beside_the_mlp(name, spec):
    """A config of model `name` and the faithful MLP, both to ONNX at opset 17."""
    return (f'[models.{name}]\nspec = "{spec}"\n\n[models.mlp]\nspec = "{TORCH_MODELS}:mlp_exact"\n\n'
            '[artifacts.onnx17]\nto = "onnx"\nopset = 17\n')


def verdicts(result):
    return {name: report.exit_code for name, report in result.jobs}


def exported_files(out_dir):
    """What each job of a run left under OUT_DIR, as an export would leave it anew: each job's log
    (its bytes and modification time: a restore copies the cached log with its time, an export writes
    the log afresh) and its published artifact (the file itself: device and inode)."""
    found = {}
    for log in sorted(Path(out_dir).rglob("log.txt")):
        job = log.parent.relative_to(out_dir).as_posix()
        found[job] = (log.read_bytes(), log.stat().st_mtime_ns)
        report = json.loads((log.parent / "report.json").read_text())
        artifact = log.parent / Path(report["artifact"]["path"]).name if report["artifact"] else None
        if artifact is not None and artifact.exists():
            found[job] += (artifact.stat().st_dev, artifact.stat().st_ino)
    return found


def test_a_config_runs_each_job_into_its_folder_then_reuses_them_all(tmp_path):
    config = write_config(tmp_path, FAST_CONFIG)
    told: dict[str, list[tuple[str, bool]]] = {}
    cold = runs.run(config, out_dir=tmp_path / "out", workers=2, cache_dir=tmp_path / "cache",
                    reports={"junit": tmp_path / "run.xml", "json": tmp_path / "run.json"},
                    progress=lambda job, message, done=False: told.setdefault(job, []).append((message, done)))
    assert verdicts(cold) == {"branch/onnx17": 1, "branch/ort-1.16": 1, "mlp/onnx17": 0, "mlp/ort-1.16": 0}
    # Each job is told done once, last, with its verdict.
    assert {job: [m for m, done in events if done] for job, events in told.items()} == {
        job: [f"{'pass' if code == 0 else 'fail'} (exit {code})"] for job, code in verdicts(cold).items()}
    assert all(events[-1][1] for events in told.values())
    assert cold.exit_code == 1 and cold.reused == 0
    assert (tmp_path / "out/mlp/onnx17/mlp.onnx").is_file() and (tmp_path / "out/mlp/onnx17/report.json").is_file()
    assert not (tmp_path / "out/branch/onnx17/branch.onnx").exists()  # nothing failed is published
    assert (tmp_path / "out/branch/onnx17/branch.onnx.rejected").is_file()
    suites = {suite.name: suite for suite in JUnitXml.fromfile(str(tmp_path / "run.xml"))}
    assert set(suites) == set(verdicts(cold))
    assert any(isinstance(r, Failure) for case in suites["branch/onnx17"] for r in case.result)
    assert suites["mlp/onnx17"].failures == 0
    assert json.loads((tmp_path / "run.json").read_text())["exit_code"] == 1

    before = exported_files(tmp_path / "out")
    told.clear()
    warm = runs.run(config, out_dir=tmp_path / "out", workers=2, cache_dir=tmp_path / "cache",
                    progress=lambda job, message, done=False: told.setdefault(job, []).append((message, done)))
    assert verdicts(warm) == verdicts(cold) and warm.reused == 4
    assert all(events[-1][1] and events[-1][0].startswith("reused from the cache") for events in told.values())
    assert all(r.reused for r in warm.results)
    print("cached re-run of 4 jobs:", ", ".join(f"{r.job.id} {r.seconds:.2f} s" for r in warm.results))
    # Nothing was exported again: each job's log is the cold run's (an export writes its own), and
    # each published artifact is the cold run's file, the very one the cache holds (a hard link).
    assert exported_files(tmp_path / "out") == before
    for _, report in warm.jobs:
        assert report.reused["made"] and any("reused from the cache" in note for note in report.notes)
    reused = warm.jobs[2][1]
    assert reused.artifact.path == str(tmp_path / "out/mlp/onnx17/mlp.onnx")
    [cached] = (tmp_path / "cache").glob(f"{reused.reused['key']}/mlp.onnx")
    assert Path(reused.artifact.path).samefile(cached)

    forced = runs.run(config, out_dir=tmp_path / "out", workers=2, only=["mlp/onnx17"], cache=False)
    assert verdicts(forced) == {"mlp/onnx17": 0} and forced.reused == 0


def test_a_cached_artifact_is_linked_and_one_changed_since_is_not_reused(tmp_path):
    config = write_config(tmp_path, FAST_CONFIG)
    cache, out = tmp_path / "cache", tmp_path / "out"
    cold = runs.run(config, out_dir=out, cache_dir=cache, only=["mlp/onnx17"])
    published = out / "mlp/onnx17/mlp.onnx"
    [cached] = cache.glob("*/mlp.onnx")
    assert verdicts(cold) == {"mlp/onnx17": 0} and published.samefile(cached)  # no second copy
    with open(cached, "r+b") as artifact:  # edited in place since: the restore would ship it
        artifact.seek(-1, 2)
        last = artifact.read(1)
        artifact.seek(-1, 2)
        artifact.write(bytes([last[0] ^ 0xFF]))
    again = runs.run(config, out_dir=out, cache_dir=cache, only=["mlp/onnx17"])
    assert verdicts(again) == {"mlp/onnx17": 0} and again.reused == 0
    report = again.jobs[0][1]
    on_disk = json.loads((out / "mlp/onnx17/report.json").read_text())["notes"]
    assert any("cached artifact of the run made" in note and "changed since" in note for note in on_disk)
    assert report.artifact.sha256 == sha256(published) == cold.jobs[0][1].artifact.sha256
    assert runs.run(config, out_dir=out, cache_dir=cache, only=["mlp/onnx17"]).reused == 1


def test_a_change_in_a_module_or_a_file_the_model_read_is_not_reused(tmp_path):
    """The config names only the model's file; the helper module it imports and the weights it
    reads are found while it loads, listed in the report, and checked before a result is reused."""
    (tmp_path / "layers.py").write_text("import torch\n\nACTIVATION = torch.nn.GELU\n")
    torch.manual_seed(0)
    torch.save(torch.nn.Linear(8, 4).state_dict(), tmp_path / "weights.pt")
    (tmp_path / "model.py").write_text(
        "import sys\nfrom pathlib import Path\n\nimport torch\n\nsys.path.insert(0, str(Path(__file__).parent))\n"
        "import layers  # noqa: E402\n\n\ndef build():\n"
        "    linear = torch.nn.Linear(8, 4)\n"
        "    linear.load_state_dict(torch.load(Path(__file__).parent / 'weights.pt'))\n"
        "    return torch.nn.Sequential(linear, layers.ACTIVATION()).eval(), (torch.randn(2, 8),)\n")
    config = write_config(tmp_path, '[models.m]\nspec = "model.py:build"\n\n[artifacts.onnx17]\nto = "onnx"\nopset = 17\n')
    cache, out = tmp_path / "cache", tmp_path / "out"
    cold = runs.run(config, out_dir=out, cache_dir=cache)
    assert verdicts(cold) == {"m/onnx17": 0}
    listed = {Path(f["path"]).name: f["sha256"] for f in cold.jobs[0][1].source_files}
    assert listed == {name: sha256(tmp_path / name) for name in ("model.py", "layers.py", "weights.pt")}
    assert runs.run(config, out_dir=out, cache_dir=cache).reused == 1

    (tmp_path / "layers.py").write_text("import torch\n\nACTIVATION = torch.nn.ReLU\n")
    changed = runs.run(config, out_dir=out, cache_dir=cache)
    assert changed.reused == 0 and changed.jobs[0][1].gelu == []  # the ReLU model was exported, not the old one
    assert any("layers.py, which the model was built from, changed since" in n for n in changed.jobs[0][1].notes)
    torch.save(torch.nn.Linear(8, 4).state_dict(), tmp_path / "weights.pt")
    assert runs.run(config, out_dir=out, cache_dir=cache).reused == 0
    assert runs.run(config, out_dir=out, cache_dir=cache).reused == 1


def test_the_cache_key_follows_exportgates_own_code_not_its_bytecode(tmp_path):
    """A source checkout changes under one version string: its code is part of the key."""
    import shutil

    from exporter.jobs import code_digest
    from tests.conftest import REPO

    for package in ("exporter", "verifiers"):
        shutil.copytree(REPO / package, tmp_path / package)
    assert code_digest(tmp_path) == code_digest(REPO)
    (tmp_path / "verifiers/__pycache__").mkdir(exist_ok=True)
    (tmp_path / "verifiers/__pycache__/stale.cpython-311.pyc").write_bytes(b"bytecode")
    assert code_digest.__wrapped__(tmp_path) == code_digest(REPO)
    with open(tmp_path / "verifiers/gelu/catalogue.py", "a") as catalogue:
        catalogue.write("# one more line\n")
    assert code_digest.__wrapped__(tmp_path) != code_digest(REPO)


# Two cheap jobs whose cache entries the tests below invalidate one input at a time.
CACHED_CONFIG = f"""
matrix = "targets.yaml"

[defaults]
batches = 2

[models.mlp]
spec = "{TORCH_MODELS}:mlp_exact"

[artifacts.onnx17]
to = "onnx"
opset = 17

[artifacts.npu]
to = "onnx"
target = "npu-1"  # of the config's matrix
"""


def write_matrix(folder, erf):
    """The config's matrix: one target, npu-1, whose runtime runs ONNX Erf or not."""
    import yaml

    flags = ("max_opset", "gelu.gelu_op", "gelu.erf", "gelu.contrib_gelu")
    npu = {"format": "onnx", "runtime": "some-npu", "version": "1", "max_opset": 17,
           "gelu": {"gelu_op": False, "erf": erf, "contrib_gelu": False},
           "sources": [{"fact": fact, "source": "vendor sheet", "quote": "..."} for fact in flags]}
    (folder / "targets.yaml").write_text(yaml.safe_dump({"schema": 1, "targets": {"npu-1": npu}}))


@pytest.fixture(scope="module")
def cold_cache(tmp_path_factory):
    """CACHED_CONFIG's folder after one run with a cache, and that run's reports by job."""
    folder = tmp_path_factory.mktemp("cold")
    write_matrix(folder, erf=True)
    config = write_config(folder, CACHED_CONFIG)
    cold = runs.run(config, out_dir=folder / "out", workers=2, cache_dir=folder / "cache")
    assert verdicts(cold) == {"mlp/npu": 0, "mlp/onnx17": 0} and cold.reused == 0
    return folder, dict(cold.jobs)


def cached_copy(cold_cache, tmp_path):
    """A copy of the cold run's config, matrix and cache, for one test to change."""
    import shutil

    folder = tmp_path / "pipeline"
    shutil.copytree(cold_cache[0], folder, ignore=shutil.ignore_patterns("out"))
    return folder


def run_cached(config, **options):
    folder = config.parent
    return runs.run(config, out_dir=folder / "out", cache_dir=folder / "cache", **options)


def reused_jobs(result):
    return {r.job.id: r.reused and r.report.reused is not None for r in result.results}


@pytest.mark.parametrize(("option", "value", "applied"), [
    ("batches", "3", lambda report: report.batches == 3),
    ("atol", '"1e-3"', lambda report: [o.atol for o in report.outputs] == [1e-3]),
    ("opset", "16", lambda report: report.actual_opset == 16),
], ids=["batches", "atol", "opset"])
def test_a_job_whose_options_changed_runs_again_beside_one_reused(cold_cache, tmp_path, option, value, applied):
    folder = cached_copy(cold_cache, tmp_path)
    changed = write_config(folder, CACHED_CONFIG + f"\n[models.mlp.artifacts.onnx17]\n{option} = {value}\n",
                           name="changed.toml")
    result = run_cached(changed)
    assert reused_jobs(result) == {"mlp/npu": True, "mlp/onnx17": False} and result.reused == 1
    report = dict(result.jobs)["mlp/onnx17"]
    assert report.exit_code == 0 and applied(report)  # exported anew, with the changed option
    assert run_cached(folder / "exportgate.toml").reused == 2  # the unchanged config still reuses both


NO_FRAMEWORK = ("import sys; sys.modules.update(dict.fromkeys(('torch', 'tensorflow', 'keras', 'tf2onnx', "
                "'ai_edge_litert', 'onnxruntime'), None))")


def test_plan_and_merge_run_with_every_framework_and_runtime_refused(cold_cache, tmp_path):
    """A CI job that plans or merges installs exportgate without extras: both commands read the
    config or the job reports alone (child processes in which importing a framework fails)."""
    from fixtures.children import run_cli

    folder, reports = cold_cache
    plan = run_cli("plan", "--format", "github", cwd=folder, prelude=NO_FRAMEWORK)
    assert plan.returncode == 0, plan.stderr
    assert [entry["job"] for entry in json.loads(plan.stdout)["include"]] == sorted(reports)
    merge = run_cli("merge", folder / "out", "--report", tmp_path / "merged.json", "--junit", tmp_path / "merged.xml",
                    "--html", tmp_path / "merged.html", cwd=tmp_path, prelude=NO_FRAMEWORK)
    assert merge.returncode == 0, merge.stderr
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert {job["job"]: job["exit_code"] for job in merged["jobs"]} == {job: 0 for job in reports}
    assert [suite.name for suite in JUnitXml.fromfile(str(tmp_path / "merged.xml"))] == sorted(reports)
    assert "<svg" in (tmp_path / "merged.html").read_text()


def test_a_changed_matrix_file_runs_the_jobs_again(cold_cache, tmp_path):
    folder = cached_copy(cold_cache, tmp_path)
    write_matrix(folder, erf=False)  # npu-1 no longer runs Erf: its job must export the Erf-free form
    result = run_cached(folder / "exportgate.toml", only=["mlp/npu"])
    assert reused_jobs(result) == {"mlp/npu": False} and result.reused == 0
    report = dict(result.jobs)["mlp/npu"]
    assert report.exit_code == 0 and report.artifact.sha256 != cold_cache[1]["mlp/npu"].artifact.sha256
    write_matrix(folder, erf=True)
    assert run_cached(folder / "exportgate.toml").reused == 2


def test_other_library_versions_run_the_jobs_again(cold_cache, tmp_path, monkeypatch):
    from exporter import jobs

    folder = cached_copy(cold_cache, tmp_path)
    installed = jobs.library_versions()
    assert installed  # what the key holds: a change in it must show
    monkeypatch.setattr(jobs, "library_versions", lambda: {**installed, "onnxruntime": "0.0.1"})
    result = run_cached(folder / "exportgate.toml", only=["mlp/onnx17"])
    assert reused_jobs(result) == {"mlp/onnx17": False} and verdicts(result) == {"mlp/onnx17": 0}
    monkeypatch.undo()
    assert run_cached(folder / "exportgate.toml").reused == 2


@pytest.mark.parametrize("limit", [{"timeout": 600}, {"memory_limit": 64}], ids=["timeout", "memory_limit"])
def test_other_runtime_limits_run_the_jobs_again(cold_cache, tmp_path, limit):
    """--timeout and --memory-limit (generous here) can change a verdict: a result made under
    other limits is not reused."""
    folder = cached_copy(cold_cache, tmp_path)
    result = run_cached(folder / "exportgate.toml", only=["mlp/onnx17"], worker=limit)
    assert reused_jobs(result) == {"mlp/onnx17": False} and verdicts(result) == {"mlp/onnx17": 0}
    assert run_cached(folder / "exportgate.toml").reused == 2


@pytest.mark.slow  # a whole release pipeline end to end, the longest runs of the default suite (CI runs slow too)
def test_plan_then_shards_then_merge_is_the_local_run(tmp_path):
    config = write_config(tmp_path, FAST_CONFIG)
    ids = runs.plan(config)["jobs"]
    assert runs.plan(config, "github") == {"include": [{"job": job} for job in ids]}
    assert runs.plan(config, "gitlab") == {"parallel": {"matrix": [{"EXPORTGATE_JOB": ids}]}}
    cache = tmp_path / "cache"
    local = runs.run(config, out_dir=tmp_path / "local", workers=2, cache_dir=cache)
    shards = [runs.run(config, out_dir=tmp_path / f"shard{i}", shard=f"{i}/2", cache=False) for i in (1, 2)]
    assert sorted(name for shard in shards for name, _ in shard.jobs) == ids
    merged = runs.merge([tmp_path / "shard1", tmp_path / "shard2"], reports={"junit": tmp_path / "merged.xml"})
    assert merged.exit_code == local.exit_code == 1
    assert [(name, r.exit_code, [f.kind for f in r.failures], [g["status"] for g in r.gelu])
            for name, r in merged.jobs] == [
        (name, r.exit_code, [f.kind for f in r.failures], [g["status"] for g in r.gelu]) for name, r in local.jobs]
    assert [suite.name for suite in JUnitXml.fromfile(str(tmp_path / "merged.xml"))] == ids


@pytest.mark.parametrize(("table", "field", "value", "message"), [
    ("artifacts.onnx17", "opset", '"seventeen"', "job mlp/onnx17: opset: must be a positive integer"),
    ("artifacts.onnx17", "colour", '"red"', "[artifacts.onnx17] colour: unknown field"),
    ("artifacts.onnx17", "target", '"ort-9"', "job mlp/onnx17: target: unknown target 'ort-9'"),
    ("artifacts.onnx17", "target", '"tflite-2.9"', "job mlp/onnx17: target: --target tflite-2.9 runs tflite"),
    ("models.mlp", "atol", '"loose"', "job mlp/onnx17: atol: --atol 'loose'"),
    ("models.mlp", "spec", '"missing.py:build"', "job mlp/onnx17: spec: "),
])
def test_a_bad_field_is_one_line_naming_job_and_field_and_nothing_runs(tmp_path, cli, table, field, value, message):
    tables = {"models.mlp": {"spec": f'"{TORCH_MODELS}:mlp_exact"'},
              "artifacts.onnx17": {"to": '"onnx"', "opset": "17"}}
    tables[table][field] = value
    write_config(tmp_path, "".join(f"[{name}]\n" + "".join(f"{k} = {v}\n" for k, v in fields.items()) + "\n"
                                   for name, fields in tables.items()))
    with pytest.raises(BadInput) as caught:
        runs.run(tmp_path / "exportgate.toml", out_dir=tmp_path / "out")
    assert message in str(caught.value) and "\n" not in str(caught.value)
    result = cli("run", "--out-dir", "out")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_job_that_crashes_is_that_jobs_failure(tmp_path):
    crashing = tmp_path / "crash.py"
    crashing.write_text("import os, torch\n\ndef build():\n    os.abort()\n")
    config = write_config(tmp_path, beside_the_mlp("crash", "crash.py:build"))
    result = runs.run(config, out_dir=tmp_path / "out", workers=2, cache=False)
    assert verdicts(result) == {"crash/onnx17": 4, "mlp/onnx17": 0}
    [finding] = result.jobs[0][1].failures
    assert finding.kind == "runtime" and "crashed (SIGABRT)" in finding.message
    assert (tmp_path / "out/crash/onnx17/log.txt").is_file()


JOB_TIMEOUT = 120  # what a healthy MLP job takes on a slow, busy machine, many times over


@pytest.mark.slow  # it waits out the generous limit
def test_a_job_past_its_time_limit_fails_alone(tmp_path, monkeypatch):
    """The held job stalls mid-export until it is killed (its stall would last STALL_SECONDS, five
    times the limit); the MLP beside it gets the same generous limit and passes."""
    from fixtures.models.torch_models import STALL_FOLDER_VARIABLE, STALL_SECONDS

    assert STALL_SECONDS >= 5 * JOB_TIMEOUT
    stall = tmp_path / "stall"
    stall.mkdir()
    monkeypatch.setenv(STALL_FOLDER_VARIABLE, str(stall))  # the jobs' workers inherit it
    config = write_config(tmp_path, beside_the_mlp("stalled", f"{TORCH_MODELS}:held_mlp"))
    result = runs.run(config, out_dir=tmp_path / "out", workers=2, cache=False, job_timeout=JOB_TIMEOUT)
    assert verdicts(result) == {"mlp/onnx17": 0, "stalled/onnx17": 4}
    [finding] = result.jobs[1][1].failures
    assert finding.kind == "runtime"
    assert finding.message == f"job stalled/onnx17 did not finish within {JOB_TIMEOUT} s (--job-timeout)"
    assert len(list(stall.glob("stalled-*"))) == 1  # it was killed in its stall, which nothing released
    assert not list((tmp_path / "out/stalled/onnx17").glob("*.onnx"))


@pytest.mark.slow  # a whole release pipeline end to end, the longest runs of the default suite (CI runs slow too)
def test_three_models_by_three_artifacts_cold_then_cached_with_one_broken_job(tmp_path, cli):
    """PyTorch (an MLP, transformers BERT) and Keras models x ONNX at an opset, ONNX for a target
    and TFLite, plus one job broken on purpose; through the CLI, as a pipeline runs it."""
    write_config(tmp_path, f"""
out_dir = "dist"

[models.mlp]
spec = "{TORCH_MODELS}:mlp_exact"

[models.bert]
spec = "{HF_MODELS}:bert"

[models.keras]
spec = "{KERAS_MODELS}:functional_activation"

[models.branch]
spec = "{TORCH_MODELS}:sign_branch"

[artifacts.onnx17]
to = "onnx"
opset = 17

[artifacts."ort-1.16"]
to = "onnx"
target = "ort-1.16"
models = ["mlp", "bert", "keras"]

[artifacts.tflite]
to = "tflite"
models = ["mlp", "bert", "keras"]
""")
    import time

    start = time.monotonic()
    cold = cli("run", "--jobs", "2", "--cache-dir", "cache", "--junit", "run.xml", "--html", "run.html",
               "--report", "run.json", timeout=3000)
    cold_seconds = time.monotonic() - start
    assert cold.returncode == 1, cold.stderr
    report = json.loads((tmp_path / "run.json").read_text())
    codes = {job["job"]: job["exit_code"] for job in report["jobs"]}
    assert len(codes) == 10 and {job for job, code in codes.items() if code} == {"branch/onnx17"}
    suites = {suite.name: suite for suite in JUnitXml.fromfile(str(tmp_path / "run.xml"))}
    assert suites["branch/onnx17"].failures >= 1 and sum(s.failures for s in suites.values()) == \
        suites["branch/onnx17"].failures
    html = (tmp_path / "run.html").read_text()
    assert "branch/onnx17" in html and html.count("<svg") >= 10

    before = exported_files(tmp_path / "dist")
    assert len(before) == 10 and all(len(files) == 4 for files in before.values())  # a log and an artifact each
    start = time.monotonic()
    warm = cli("run", "--jobs", "2", "--cache-dir", "cache", "--report", "warm.json")
    warm_seconds = time.monotonic() - start
    assert warm.returncode == 1 and "10 reused from the cache" in warm.stderr
    warm_jobs = json.loads((tmp_path / "warm.json").read_text())["jobs"]
    assert {job["job"]: job["exit_code"] for job in warm_jobs} == codes
    assert all(job["reused"]["made"] for job in warm_jobs)
    assert exported_files(tmp_path / "dist") == before  # no export ran: the same logs, the same artifact files
    print(f"cold {cold_seconds:.1f} s, cached {warm_seconds:.1f} s")  # measured, not asserted


def test_the_config_may_live_in_pyproject(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text(f"""
[project]
name = "someone-elses-model"

[tool.exportgate.models.mlp]
spec = "{TORCH_MODELS}:mlp_exact"

[tool.exportgate.artifacts.onnx17]
to = "onnx"
opset = 17
""")
    monkeypatch.chdir(tmp_path)
    assert runs.plan() == {"jobs": ["mlp/onnx17"]}
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'no-pipeline'\n")
    with pytest.raises(BadInput, match="no exportgate.toml here"):
        runs.plan()



# Values a job may give the options that take names (the rest follow from each option's type).
_NAMED_VALUES = {"to": "onnx", "opset": 17, "exporter": "torchscript", "quantize": "int8", "io": "float",
                 "calibration": "data.npz", "data": "data.npz", "target": "ort-1.16", "gelu": "preserve", "inputs": ["x:2x4:float32"],
                 "dynamic": ["x:0"], "atol": ["1e-3"], "rtol": ["1e-2"], "task": "text-classification",
                 "keep_fp32": ["Softmax"], "baseline": "data.npz",
                 "baseline_artifact": "data.npz"}


def _job_value(option):
    """A value other than the default, of the option's type."""
    if option.name in _NAMED_VALUES:
        return _NAMED_VALUES[option.name]
    if option.type is bool:
        return not option.default if option.default is not None else True
    return {int: 3, float: 0.5}[option.type]


def test_a_job_can_set_every_option_export_takes(tmp_path):
    """Every option of the export command, but where its files go, how it prints, the runtime
    worker's settings (the run's own) and the target matrix (the config's top level), is a config
    field; a job setting each hands it to the export it runs, as export's own parser reads it."""
    import tomllib

    import typer.main

    from exporter import options
    from exporter.cli import app
    from exporter.config import load_config
    from exporter.jobs import export_arguments

    settable = [option for option in options.of("export") if option.to == "api" and not option.argument
                and option.name not in ("out", "matrix")]
    assert [option.name for option in settable if not option.job] == []
    values = {option.name: _job_value(option) for option in settable}
    # Two jobs: the int8 options and the float16 ones exclude each other.
    by_job = {"int8": {k: v for k, v in values.items() if k != "keep_fp32"},
              "fp16": {**{k: v for k, v in values.items() if k != "allow_float_ops"}, "quantize": "fp16"}}
    (tmp_path / "data.npz").write_bytes(b"")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "config.json").write_text("{}")
    tables = [f"[artifacts.{name}]\n" + "\n".join(f"{key} = {json.dumps(value)}" for key, value in fields.items())
              for name, fields in by_job.items()]
    (tmp_path / "exportgate.toml").write_text('[models.m]\nspec = "folder"\n\n' + "\n\n".join(tables))
    assert tomllib.loads((tmp_path / "exportgate.toml").read_text())["artifacts"] == by_job

    command = typer.main.get_command(app).commands["export"]
    for job in load_config(tmp_path / "exportgate.toml").jobs:
        fields = by_job[job.id.split("/")[1]]
        args = export_arguments(job, tmp_path / "out.onnx", tmp_path / "report.json", {})
        parsed = command.make_context("export", args[1:]).params
        for option in settable:
            if option.name not in fields:
                continue
            given = parsed[option.parameter]
            given = (not given) if option.negated else given
            expected = fields[option.name]
            if option.reads:  # resolved against the config's folder
                expected = str(tmp_path / expected)
            assert given == expected, (option.name, given, expected, args)
    assert {name for fields in by_job.values() for name in fields} == set(values)
