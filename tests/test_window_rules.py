"""Every window rule's cases (preemptdiag/diagnose/window_rules.toml), run by one test:
the rule decides the window it is about (or passes it on), with the class and
confidence the case names; every rule documents itself and has cases."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from builders import make_event, make_window

from preemptdiag.diagnose.visibility import StatsOff, Visibility
from preemptdiag.diagnose.window_rules import RULES, classify_window, rule_cases
from preemptdiag.model.config import Thresholds
from preemptdiag.model.records import Kind

CASES = list(rule_cases())
BY_ID = {r.id: r for r in RULES}


def _window(case: dict[str, Any]) -> Any:
    fields = {k: (None if v == "none" else v) for k, v in case.get("window", {}).items()}
    return make_window(0, **fields)


@pytest.mark.parametrize("case", CASES, ids=[f"{c['rule']}: {c['title']}" for c in CASES])
def test_case(case: dict[str, Any]) -> None:
    w, thr = _window(case), Thresholds()
    # `stats_off`: the log says this window's engine prints no stats lines
    off = (
        (StatsOff(w.replica, "case", make_event(Kind.CONTEXT, {}), ""),)
        if case.get("stats_off")
        else ()
    )
    vis = Visibility(bool(case.get("blind", False)), None, "case", stats_off=off)
    rule = BY_ID[case["rule"]]
    got = rule.check(w, thr, vis)
    if case.get("applies", True) is False:
        assert got is None
        return
    decided = classify_window(w, thr, vis)
    first = next(r for r in RULES if r.check(w, thr, vis) is not None)
    assert first.id == case.get("decided_by", rule.id)
    assert (decided.cls.value, decided.confidence.value) == (case["class"], case["confidence"])
    assert decided.why


@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_every_rule_documents_itself_and_has_cases(rule: Any) -> None:
    assert rule.doc and "Example:" in rule.doc, rule.id
    mine = [c for c in CASES if c["rule"] == rule.id]
    assert any(c.get("applies", True) and "decided_by" not in c for c in mine), rule.id
    assert all(c.get("class", rule.cls.value) for c in mine)


def test_rule_ids_are_unique_and_in_order() -> None:
    ids = [r.id for r in RULES]
    assert ids == sorted(set(ids))
    assert replace(RULES[-1]).name == "healthy"  # the catch-all comes last


def test_explain_shows_the_rules_and_their_cases(capsys: pytest.CaptureFixture[str]) -> None:
    from preemptdiag.cli import main

    assert main(["explain", "rules"]) == 0
    out = capsys.readouterr().out
    assert "PD107 suspected-preemption" in out and out.index("PD101") < out.index("PD110")
    assert main(["explain", "PD107"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PD107 suspected-preemption -> insufficient_evidence")
    assert "Why never queueing" in out
    assert "- the same window where the counter can see: not suspected" in out
    # a rule whose cases give a second class names it, in the list and on its own
    assert main(["explain", "rules"]) == 0
    assert (
        "PD106 no-stats               -> healthy | insufficient_evidence\n"
        in capsys.readouterr().out
    )
    assert main(["explain", "PD106"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PD106 no-stats -> healthy | insufficient_evidence\n\nOnly start-up")
    assert "no evidence of health (insufficient_evidence, low)" in out
