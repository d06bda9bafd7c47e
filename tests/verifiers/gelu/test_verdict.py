"""Aligning source and artifact sites and judging each GELU."""

from verifiers.gelu.catalogue import Site
from verifiers.gelu.verdict import (
    ADDED,
    CHANGED,
    DECLARED,
    KEPT,
    REMOVED,
    judge,
)
from verifiers.gelu.site_flavour import SiteFlavour


def _sites(*flavours, prefix="s", residuals=None):
    return [
        SiteFlavour(Site(f"{k}:{prefix}{k}", "op", f, (f"{prefix}{k}",), "in", "out"), f,
                    measured=f, residuals=residuals or {})
        for k, f in enumerate(flavours)
    ]


def _statuses(verdicts):
    return [(v.status, v.source and v.source.flavour, v.artifact and v.artifact.flavour) for v in verdicts]


def test_all_kept():
    verdicts = judge(_sites("exact", "tanh"), _sites("exact", "tanh", prefix="a"))
    assert _statuses(verdicts) == [(KEPT, "exact", "exact"), (KEPT, "tanh", "tanh")]
    assert not any(v.failed for v in verdicts)


def test_one_of_several_changed_stays_in_place():
    verdicts = judge(_sites("exact", "exact", "exact"), _sites("exact", "tanh", "exact", prefix="a"))
    assert _statuses(verdicts)[1] == (CHANGED, "exact", "tanh")
    assert [v.failed for v in verdicts] == [False, True, False]
    assert verdicts[1].artifact.site.site_id == "1:a1"


def test_gelu_turned_relu_among_relus():
    source = _sites("relu", "exact", "relu")
    artifact = _sites("relu", "relu", "relu", prefix="a")
    assert _statuses(judge(source, artifact)) == [(CHANGED, "exact", "relu")]


def test_removed_and_added():
    assert _statuses(judge(_sites("exact", "tanh"), _sites("exact", prefix="a"))) == [
        (KEPT, "exact", "exact"), (REMOVED, "tanh", None)]
    assert _statuses(judge(_sites("exact"), _sites("exact", "quick", prefix="a"))) == [
        (KEPT, "exact", "exact"), (ADDED, None, "quick")]


def test_declared_change_does_not_fail():
    [verdict] = judge(_sites("exact"), _sites("tanh", prefix="a"), declared={"exact": "tanh"})
    assert verdict.status == DECLARED and not verdict.failed


def test_message_names_both_sites_flavours_and_deviation():
    [verdict] = judge(_sites("exact"), _sites("tanh", prefix="a", residuals={"exact": 4.7e-4, "tanh": 1e-7}))
    message = verdict.message()
    assert "source 0:s0 (op) is exact" in message and "artifact 0:a0 (op) computes tanh" in message
    assert "0.00047 from exact" in message
