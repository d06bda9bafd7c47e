"""opset_matrix.yaml: load, merge and validate the target matrix.

The packaged matrix lists what each target supports, every fact with its source. A user file
(`--matrix my.yaml`) adds targets or replaces whole entries. A malformed entry raises BadInput
with one line naming the file, the target and the field. Each format says its version-limit
field, its other fields and its gelu flags (verifiers.formats).
"""

from __future__ import annotations

import difflib
from pathlib import Path

import yaml

from verifiers.errors import BadInput, one_line
from verifiers.formats import FORMATS
from verifiers.targets import FLOAT16_ARITHMETIC, INTEGER_DTYPES, LIMIT_FIELDS, RANK_FIELDS, OpGap, Source, Target

SCHEMA = 1
COMMON_FIELDS = {"format", "runtime", "version", "gelu", "dtypes", "op_gaps", "sources", "confirmed_by_test",
                 "integer_only", "integer_dtypes", "static_shapes", "ops", "float16"}


def packaged_matrix_path() -> Path:
    """The wheel ships verifiers/opset_matrix.yaml; a source checkout has it at the repository root."""
    here = Path(__file__).parent
    for candidate in (here / "opset_matrix.yaml", here.parent / "opset_matrix.yaml"):
        if candidate.is_file():
            return candidate
    raise BadInput("opset_matrix.yaml not found next to verifiers/ or at the repository root")


def load_targets(extra: Path | None = None) -> dict[str, Target]:
    """The packaged targets, with the entries of `extra` added or replacing same-named ones."""
    entries = _read_matrix(packaged_matrix_path())
    if extra is not None:
        entries.update(_read_matrix(Path(extra)))
    return {name: _build(name, raw, label) for name, (raw, label) in entries.items()}


def get_target(name: str, targets: dict[str, Target]) -> Target:
    if name in targets:
        return targets[name]
    close = difflib.get_close_matches(name, list(targets), n=5, cutoff=0.5)
    if close:
        raise BadInput(f"unknown target '{name}'; did you mean: {', '.join(close)}?")
    raise BadInput(f"unknown target '{name}'; known targets: {', '.join(sorted(targets))}")


# yaml.safe_load's loader in libyaml's C parser where PyYAML was built with it (its wheels are):
# the packaged matrix parses in about a tenth of the pure-Python parser's time.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_matrix(path: Path) -> dict[str, tuple[object, str]]:
    """Raw entries keyed by target name, each paired with the file label used in errors."""
    label = path.name
    try:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_SAFE_LOADER)
    except OSError as exc:
        raise BadInput(f"{label}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise BadInput(f"{label}: not valid YAML: {one_line(exc)}") from exc
    if not isinstance(doc, dict):
        raise BadInput(f"{label}: expected a mapping with 'schema' and 'targets'")
    if doc.get("schema") != SCHEMA:
        raise BadInput(f"{label}: field 'schema' must be {SCHEMA}")
    targets = doc.get("targets")
    if not isinstance(targets, dict) or not targets:
        raise BadInput(f"{label}: field 'targets' must be a non-empty mapping")
    return {str(name): (raw, label) for name, raw in targets.items()}


def _build(name: str, raw: object, label: str) -> Target:
    def fail(field: str, problem: str) -> BadInput:
        return BadInput(f"{label}: target '{name}': field '{field}' {problem}")

    if not isinstance(raw, dict):
        raise BadInput(f"{label}: target '{name}' must be a mapping")
    fmt = raw.get("format")
    if fmt not in FORMATS:
        raise fail("format", f"must be one of {', '.join(FORMATS)}")
    artifact_format = FORMATS[fmt]
    unknown = sorted(set(raw) - COMMON_FIELDS - {artifact_format.target_limit} - set(artifact_format.target_fields))
    if unknown:
        raise fail(unknown[0], f"is not a field of {fmt} targets")

    def text(field: str, value: object) -> str:
        if not isinstance(value, str) or not value.strip():
            raise fail(field, "must be a non-empty string")
        return value

    def seq(field: str) -> list:
        value = raw.get(field, [])
        if not isinstance(value, list):
            raise fail(field, "must be a list")
        return value

    runtime = text("runtime", raw.get("runtime"))
    version = text("version", raw.get("version"))

    limits = dict.fromkeys(LIMIT_FIELDS)
    limits.update(artifact_format.target_limits(raw, fail))

    gelu_raw = raw.get("gelu")
    if not isinstance(gelu_raw, dict):
        raise fail("gelu", f"must be a mapping with {', '.join(artifact_format.gelu_flags)}")
    gelu = {}
    for flag in artifact_format.gelu_flags:
        if flag not in gelu_raw:
            raise fail(f"gelu.{flag}", "is required (null when not sourced)")
        if gelu_raw[flag] is not None and not isinstance(gelu_raw[flag], bool):
            raise fail(f"gelu.{flag}", "must be true, false or null")
        gelu[flag] = gelu_raw[flag]
    extra_flags = sorted(set(gelu_raw) - set(artifact_format.gelu_flags))
    if extra_flags:
        raise fail(f"gelu.{extra_flags[0]}", f"is not a gelu flag of {fmt} targets")

    dtypes = None
    if "dtypes" in raw:
        dtypes = tuple(text("dtypes", d) for d in seq("dtypes"))

    op_gaps = []
    for gap in seq("op_gaps"):
        if not isinstance(gap, dict) or set(gap) != {"op", "note"}:
            raise fail("op_gaps", "entries must be {op: ..., note: ...}")
        op_gaps.append(OpGap(text("op_gaps", gap["op"]), text("op_gaps", gap["note"])))

    sources = []
    for entry in seq("sources"):
        if not isinstance(entry, dict) or set(entry) != {"fact", "source", "quote"}:
            raise fail("sources", "entries must be {fact: ..., source: ..., quote: ...}")
        sources.append(Source(*(text("sources", entry[k]) for k in ("fact", "source", "quote"))))

    confirmed = tuple(text("confirmed_by_test", key) for key in seq("confirmed_by_test"))

    def flag(field: str) -> bool | None:
        value = raw.get(field)
        if value is not None and not isinstance(value, bool):
            raise fail(field, "must be true, false or null")
        return value

    integer_only, static_shapes = flag("integer_only"), flag("static_shapes")
    integer_dtypes = tuple(text("integer_dtypes", d) for d in seq("integer_dtypes"))
    if integer_only is True and not integer_dtypes:
        raise fail("integer_dtypes", f"is required with integer_only: true (a list of {', '.join(INTEGER_DTYPES)})")
    if integer_dtypes and integer_only is not True:
        raise fail("integer_dtypes", "is only for integer_only: true")
    if set(integer_dtypes) - set(INTEGER_DTYPES):
        raise fail("integer_dtypes", f"must list only {', '.join(INTEGER_DTYPES)}")

    ranks = {}
    for field in RANK_FIELDS:
        value = raw.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise fail(field, "must be a positive integer or null")
        ranks[field] = value

    ops = None
    if raw.get("ops") is not None:
        ops = tuple(text("ops", op) for op in seq("ops"))
        if not ops:
            raise fail("ops", "must list at least one op (null when not sourced)")

    float16 = raw.get("float16")
    if float16 is not None and float16 not in FLOAT16_ARITHMETIC:
        raise fail("float16", f"must be {' or '.join(FLOAT16_ARITHMETIC)} (what float16 ops compute in), or null")

    target = Target(
        name=name,
        format=fmt,
        runtime=runtime,
        version=version,
        **limits,
        gelu=gelu,
        dtypes=dtypes,
        op_gaps=tuple(op_gaps),
        sources=tuple(sources),
        confirmed_by_test=confirmed,
        integer_only=integer_only,
        integer_dtypes=integer_dtypes,
        static_shapes=static_shapes,
        **ranks,
        ops=ops,
        float16=float16,
    )
    facts = target.fact_keys()
    sourced = {s.fact for s in target.sources}
    if facts - sourced:
        raise fail(min(facts - sourced), "has no entry in 'sources'")
    if sourced - facts:
        raise fail("sources", f"cites '{min(sourced - facts)}', which is not a non-null fact of this target")
    if set(confirmed) - facts:
        raise fail(
            "confirmed_by_test", f"lists '{min(set(confirmed) - facts)}', which is not a non-null fact of this target"
        )
    return target
