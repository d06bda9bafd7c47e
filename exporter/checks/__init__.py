"""The checks of an artifact against its source, one module per concern, shared by export and
verify: outputs, sizes (the dynamic axes), data (the user's samples, --data), generation (a decoder
with past), quantization (an int8 artifact's layers), GELU, localisation (where a red run
departs) and, with --measure, measurement (what the artifact costs), in the order they run. The
target check (exporter.checks.target) runs without the source, for export and check.

A command is its own steps, then SOURCE_STEPS (each check's steps on the source), then, once the
artifact is made or opened, PRECISION_STEPS (its precision read, and the source let go unless a
check keeps it), then JUDGING_STEPS (the artifact loaded, then each check's steps on it).
"""

from __future__ import annotations

from exporter.checks import data, gelu, generation, localization, measurement, outputs, quantization, sizes
from exporter.verification import LOAD_ARTIFACT, Verification
from verifiers.steps import Step

CHECKS = (outputs.CHECK, sizes.CHECK, data.CHECK, generation.CHECK, quantization.CHECK, gelu.CHECK,
          localization.CHECK, measurement.CHECK)


def _releases_source(run: Verification) -> bool:
    """Only the artifact runs from here on, unless a check still needs the source."""
    return not any(check.keeps_source(run) for check in CHECKS if check.keeps_source is not None)


def _release_source(run: Verification) -> None:
    """The source's weights go; the collection of its cycles runs while the artifact loads or runs
    in its worker, and is over before the run ends."""
    collecting = run.source.release(collect_aside=True)
    run.cleanups.callback(collecting.join)


SOURCE_STEPS = tuple(step for check in CHECKS for step in check.on_source)
PRECISION_STEPS = (
    quantization.PRECISION,
    Step("release_source", _release_source, when=_releases_source),
)
JUDGING_STEPS = (LOAD_ARTIFACT, *(step for check in CHECKS for step in check.on_artifact))
