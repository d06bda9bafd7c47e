"""The GELU check: the source's GELU sites read while it is loaded (the guard on), every GELU of
the artifact found and measured against them (verifiers.judging.judge_gelu), and how sensitive the
outputs' tolerance is to the GELU flavour where the artifact's GELU can be rewritten."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.checks.outputs import Outputs
from exporter.verification import Check, Verification, runs_the_artifact
from verifiers.judging import gelu_sensitivity, judge_gelu
from verifiers.steps import Step


@dataclass
class Gelu:
    captured: list | str | None = None  # the source's GELU sites, why they could not be read, or None (guard off)
    artifact_sites: list | None = None
    declared: dict[str, str] | None = None  # GELU flavour changes the user asked for (export --gelu)


def _capture(run: Verification) -> None:
    run.of(Gelu).captured = run.source.activation_sites(run.feeds[0])


def _judge(run: Verification) -> None:
    gelu = run.of(Gelu)
    gelu.artifact_sites = judge_gelu(run.report, run.artifact, gelu.captured, run.runner, gelu.declared,
                                     run.progress, configured=run.source.configured)


def _sensitivity(run: Verification) -> None:
    gelu_sensitivity(run.report, run.artifact, run.of(Gelu).artifact_sites, run.of(Outputs).comparison,
                     run.tolerances)


def _sensitivity_applies(run: Verification) -> bool:
    return run.of(Gelu).artifact_sites is not None and run.artifact.gelu_rewritable


CHECK = Check(
    "gelu",
    on_source=(Step("gelu_source", _capture, message=lambda run: "reading the GELU sites of the source",
                    when=lambda run: run.active and run.options["gelu_guard"]),),
    on_artifact=(
        Step("gelu", runs_the_artifact(_judge),
             message=lambda run: run.options["gelu_guard"] and "finding the GELU sites of the source and measuring "
                                                              "the artifact's",
             when=lambda run: run.active),
        Step("gelu_sensitivity", runs_the_artifact(_sensitivity),
             when=lambda run: run.active and not run.by_signatures and _sensitivity_applies(run)),
    ),
)
