"""`preemptdiag explain CLASS|SIGNATURE-ID|rules|RULE-ID`: runbook text from the same
data the rules and signatures use."""

from __future__ import annotations

import inspect
from dataclasses import asdict
from pathlib import Path

from preemptdiag.diagnose.runbook import DOCS
from preemptdiag.diagnose.window_rules import RULES, WindowRule, rule_cases
from preemptdiag.model.config import Thresholds
from preemptdiag.model.errors import DiagError
from preemptdiag.model.records import Class
from preemptdiag.scan.signatures import load


def explain_class(cls: Class) -> str:
    d = DOCS[cls]
    thr = asdict(Thresholds())
    levers = "\n".join(f"  {i}. {lv}" for i, lv in enumerate(d.levers, 1))
    return (
        f"{cls.value}: {d.title}\n\n"
        f"Mechanism:\n  {d.mechanism}\n\n"
        f"How to confirm:\n  {d.confirm}\n\n"
        f"Lever order (the report picks the first that applies):\n{levers}\n\n"
        f"How to verify:\n  {d.verify}\n\n"
        f"What not to do:\n  {d.do_not}\n\n"
        f"Default thresholds: " + ", ".join(f"{k}={v}" for k, v in thr.items())
    )


def explain_signature(sig_id: str, user_dir: Path | None) -> str | None:
    for s in load(user_dir):
        if s.id == sig_id:
            ex = "\n".join(f"  + {e.line}" for e in s.matches[:3])
            nx = "\n".join(f"  - {line}" for line in s.no_matches[:3])
            return (
                f"{s.id} ({s.kind.value}, {s.engine}, {s.versions or 'all versions'})\n\n"
                f"{s.description}\n\n"
                f"Prefilter: {', '.join(repr(p) for p in s.prefilter)}\n"
                f"Pattern: {s.pattern}\n\nMatches:\n{ex}\n\nDoes not match:\n{nx}\n"
                f"\nDefined in {s.path}"
            )
    return None


def explain_rule(rule: WindowRule) -> str:
    cases = "\n".join(
        f"  {'+' if c.get('applies', True) else '-'} {c['title']}"
        + (f" ({c['class']}, {c['confidence']})" if c.get("applies", True) else "")
        for c in rule_cases()
        if c["rule"] == rule.id
    )
    doc = inspect.cleandoc(rule.doc)
    return f"{rule.id} {rule.name} -> {_classes(rule)}\n\n{doc}\n\nCases:\n{cases}\n"


def _classes(rule: WindowRule) -> str:
    """The rule's class, and any other its own cases give it (PD106: insufficient
    evidence where the engine said it logs no stats lines)."""
    found = [rule.cls.value]
    for c in rule_cases():
        mine = c["rule"] == rule.id and c.get("applies", True) and "decided_by" not in c
        if mine and c["class"] not in found:
            found.append(c["class"])
    return " | ".join(found)


def explain_rules() -> str:
    head = (
        "Window rules, tried in this order; the first that applies classifies the window.\n"
        "Consecutive preempting windows with KV pinned then become a thrash loop.\n\n"
    )
    return head + "\n".join(f"{r.id} {r.name:<22} -> {_classes(r)}" for r in RULES) + "\n"


def explain_topic(topic: str, user_dir: Path | None = None) -> str:
    try:
        return explain_class(Class(topic))
    except ValueError:
        pass
    if topic == "rules":
        return explain_rules()
    rule = next((r for r in RULES if topic in (r.id, r.name)), None)
    if rule is not None:
        return explain_rule(rule)
    text = explain_signature(topic, user_dir)
    if text is not None:
        return text
    classes = ", ".join(c.value for c in Class)
    raise DiagError(
        f"unknown topic {topic!r}: give a class ({classes}), `rules`, a rule id (PD101) "
        "or a signature id (see `preemptdiag signatures list`)"
    )
