"""A release pipeline's configuration: models x artifacts, one job per pair.

`exportgate.toml` (or `[tool.exportgate]` in pyproject.toml):

    out_dir = "dist"                  # default for --out-dir
    matrix = "targets.yaml"           # extra targets, as --matrix

    [defaults]                        # options of every job
    batches = 3

    [models.bert]                     # a model: its MODEL spec and its options
    spec = "models.py:bert"           # relative to the config's folder
    atol = ["1e-4", "logits=1e-5"]
    files = ["weights"]               # files it reads unseen (native loaders): a change runs it again

    [models.classifier]               # a transformers model folder (every file in it is hashed)
    spec = "classifier"
    task = "text-classification"      # default: the one its config's architecture does

    [artifacts.onnx17]                # an artifact: format and the options that make it
    to = "onnx"
    opset = 17
    models = ["bert"]                 # which models get it (default: every model)

    [models.bert.artifacts.onnx17]    # options of one job
    rtol = "2e-3"

A job's options are those of `exportgate export`, merged in this order (the later wins):
[defaults], the model's table, the artifact's table, the job's table. Every job gets a stable id,
MODEL/ARTIFACT ("bert/onnx17"). `load_jobs` validates the whole file before anything runs: a bad
field is one line naming the job (or table) and the field, and nothing runs.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.options import as_strings, job_options
from verifiers.errors import BadInput, ExportgateError, one_line

CONFIG_FILES = ("exportgate.toml", "pyproject.toml")


_OPTIONS = job_options()  # a job's fields: export's options a job may set (exporter.options)
_MODEL_KEYS = {"spec", "files", "artifacts"}
_ARTIFACT_KEYS = {"models"}
_TOP_KEYS = {"out_dir", "matrix", "defaults", "models", "artifacts"}


@dataclass(frozen=True)
class Job:
    """One model x artifact: what `exportgate export` gets, and what its result depends on."""

    id: str  # "bert/onnx17"
    model: str  # the MODEL spec, resolved against the config's folder
    options: dict[str, Any]  # api.export's keyword arguments but out and the reports
    files: tuple[Path, ...]  # the model's files: a change in one means the job runs again
    matrix: Path | None = None

    @property
    def suffix(self) -> str:
        from verifiers.formats import FORMATS

        return FORMATS[self.options["to"]].suffixes[0]

    def artifact_name(self) -> str:
        return self.id.split("/")[0] + self.suffix


@dataclass
class Config:
    path: Path
    jobs: list[Job]
    out_dir: Path | None = None
    matrix: Path | None = None


def find_config(path: str | Path | None) -> Path:
    """The config file given, or exportgate.toml, else a pyproject.toml with [tool.exportgate], here."""
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise BadInput(f"{path}: no such config file")
        return path
    for name in CONFIG_FILES:
        candidate = Path(name)
        if candidate.is_file() and (name != "pyproject.toml" or "exportgate" in _read(candidate).get("tool", {})):
            return candidate
    raise BadInput("no exportgate.toml here (nor a pyproject.toml with [tool.exportgate]); give the config's path")


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        raise BadInput(f"{path}: not a readable TOML file: {one_line(exc)}") from exc


def load_config(path: str | Path | None = None) -> Config:
    """Read and validate the config: every job's options are checked as `export` checks them."""
    from exporter.api import check_export_options

    path = find_config(path)
    raw = _read(path)
    if path.name == "pyproject.toml":
        raw = raw.get("tool", {}).get("exportgate", {})
    base = path.parent
    where = str(path)
    _only(raw, _TOP_KEYS, where, "")
    defaults = _table(raw, "defaults", where)
    _only(defaults, set(_OPTIONS), where, "[defaults] ")
    models = _table(raw, "models", where)
    artifacts = _table(raw, "artifacts", where)
    if not models or not artifacts:
        raise BadInput(f"{where}: needs at least one [models.NAME] and one [artifacts.NAME]")
    matrix = _path(raw, "matrix", base, where)
    jobs = []
    for artifact_name, artifact in artifacts.items():
        artifact = _table(artifacts, artifact_name, where, f"artifacts.{artifact_name}")
        _only(artifact, set(_OPTIONS) | _ARTIFACT_KEYS, where, f"[artifacts.{artifact_name}] ")
        chosen = artifact.get("models", list(models))
        if as_strings(chosen) is None or any(name not in models for name in chosen):
            raise BadInput(f"{where}: [artifacts.{artifact_name}] models: must list model names of [models] "
                           f"({', '.join(models)})")
        for model_name in chosen:
            jobs.append(_job(model_name, models, artifact_name, artifact, defaults, base, matrix, where))
    for job in jobs:
        try:
            check_export_options(job.model, out=Path("out") / job.id / job.artifact_name(), matrix=job.matrix,
                                 **job.options)
        except Exception as exc:  # BadInput; Incompatible: an opset above the target's
            message = str(exc) if isinstance(exc, ExportgateError) else one_line(exc)
            field = getattr(exc, "option", None)
            raise BadInput(f"{where}: job {job.id}: {field + ': ' if field else ''}{message}") from exc
    jobs.sort(key=lambda job: job.id)
    return Config(path, jobs, _path(raw, "out_dir", base, where, must_exist=False), matrix)


def _job(model_name: str, models: dict, artifact_name: str, artifact: dict, defaults: dict, base: Path,
         matrix: Path | None, where: str) -> Job:
    job_id = f"{model_name}/{artifact_name}"
    model = _table(models, model_name, where, f"models.{model_name}")
    _only(model, set(_OPTIONS) | _MODEL_KEYS, where, f"[models.{model_name}] ")
    overrides = _table(_table(model, "artifacts", where, f"models.{model_name}.artifacts"), artifact_name, where,
                       f"models.{model_name}.artifacts.{artifact_name}")
    _only(overrides, set(_OPTIONS), where, f"[models.{model_name}.artifacts.{artifact_name}] ")
    spec = model.get("spec")
    if not isinstance(spec, str) or not spec:
        raise BadInput(f"{where}: job {job_id}: spec: [models.{model_name}] needs spec = \"file.py:callable\" "
                       "(or a .keras or .pt2 file, or a transformers model folder)")
    model_path, sep, attr = spec.rpartition(":")
    file = base / (model_path if sep and model_path.endswith(".py") else spec)
    if not (file.is_file() or (file / "config.json").is_file()):
        raise BadInput(f"{where}: job {job_id}: spec: {file}: "
                       + ("a folder without config.json (not a transformers model folder)" if file.is_dir()
                          else "no such file"))
    extra = as_strings(model.get("files", []))
    if extra is None:
        raise BadInput(f"{where}: job {job_id}: files: must be a path or a list of paths")
    options: dict[str, Any] = {}
    for table, label in ((defaults, "defaults"), (model, f"models.{model_name}"), (artifact, f"artifacts.{artifact_name}"),
                         (overrides, f"models.{model_name}.artifacts.{artifact_name}")):
        for key, value in table.items():
            if key not in _OPTIONS:
                continue
            parsed = _OPTIONS[key].parse_field(value)
            if parsed is None:
                raise BadInput(f"{where}: job {job_id}: {key}: must be {_OPTIONS[key].expectation()}, got {value!r} "
                               f"(in [{label}])")
            options[key] = parsed
    if "to" not in options:
        raise BadInput(f"{where}: job {job_id}: to: [artifacts.{artifact_name}] needs to = \"onnx\" or \"tflite\"")
    files = [file, *(base / name for name in extra)]
    for key in [key for key in options if _OPTIONS[key].reads]:
        options[key], read_file = _read_spec(key, options[key], base, f"{where}: job {job_id}")
        files.append(read_file)
    for extra_file in files[1:]:
        if not extra_file.exists():
            raise BadInput(f"{where}: job {job_id}: files: {extra_file}: no such file or folder")
    model_spec = f"{file}:{attr}" if sep and model_path.endswith(".py") else str(file)
    return Job(job_id, model_spec, options, tuple(files), matrix)


def _table(raw: dict, key: str, where: str, label: str | None = None) -> dict:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise BadInput(f"{where}: [{label or key}] must be a table")
    return value


def _only(table: dict, allowed: set[str], where: str, label: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise BadInput(f"{where}: {label}{unknown[0]}: unknown field (known: {', '.join(sorted(allowed))})")


def _path(raw: dict, key: str, base: Path, where: str, must_exist: bool = True) -> Path | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadInput(f"{where}: {key}: must be a path")
    path = base / value
    if must_exist and not path.is_file():
        raise BadInput(f"{where}: {key}: {path}: no such file")
    return path


def _read_spec(key: str, spec: str, base: Path, where: str) -> tuple[str, Path]:
    """The spec of an option that reads files (--calibration, --data) resolved against the config's
    folder, and the file or folder it reads (its content is part of the job's cache key)."""
    path, sep, attr = spec.rpartition(":")
    if not (sep and path.endswith(".py")):
        path, attr = spec, ""
    file = base / path
    if not file.exists():
        raise BadInput(f"{where}: {key}: {file}: no such file or folder")
    return (f"{file}:{attr}" if attr else str(file)), file


def files_digest(paths: tuple[Path, ...]) -> str:
    """SHA-256 over the files (folders: every file under them, by relative path) and their names."""
    digest = hashlib.sha256()
    for path in paths:
        members = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for member in members:
            digest.update(str(member.relative_to(path.parent)).encode() + b"\0")
            with open(member, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()
