"""What the checker found: its verdicts (safety, liveness, accounting), counts, notes and examples."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CheckResult", "MAX_EXAMPLES"]

MAX_EXAMPLES = 20  # violations kept verbatim; all are counted


@dataclass
class CheckResult:
    """Everything the checker found. ``safety_ok`` is the verdict that must never fail."""

    messages: int = 0
    applied: int = 0
    ignored: int = 0
    bad: int = 0
    bad_reasons: Counter[str] = field(default_factory=Counter)
    dead_letters: int = 0
    dead_letter_duplicates: int = 0
    dead_letters_unexpected: int = 0
    """Dead-lettered by the job, valid for this checker."""
    dead_letters_missing: int = 0
    """Bad for this checker, not dead-lettered by the job: silently lost."""
    directives: int = 0
    directive_duplicates: int = 0
    expire_directives: int = 0
    snapshot_requests: int = 0
    alerts_raised: Counter[str] = field(default_factory=Counter)
    alerts_cleared: Counter[str] = field(default_factory=Counter)
    clusters: dict[str, dict[str, Any]] = field(default_factory=dict)
    holds_checked: int = 0
    excused_late_holds: int = 0
    unsure_checks: int = 0
    """Directive checks of nodes whose events this checker missed (offsets skipped: records deleted before
    it read them), not made until the node restated its holds."""
    basis_checked: int = 0
    basis_unverified: int = 0
    basis_min_mismatches: int = 0
    basis_not_topology: int = 0
    members_records: int = 0
    violations: int = 0
    order_violations: int = 0
    violation_examples: list[str] = field(default_factory=list)
    longest_hold_ms: int = 0
    max_lag: int | None = None
    """Worst safe-point lag after the warm-up, in MVCC units."""
    lag_bound: int = 0
    lag_samples: int = 0
    first_wall_ms: int | None = None
    last_wall_ms: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def safety_ok(self) -> bool:
        return self.violations == 0 and self.order_violations == 0 and self.basis_unverified == 0

    @property
    def liveness_ok(self) -> bool:
        return self.max_lag is not None and self.max_lag <= self.lag_bound

    @property
    def accounting_ok(self) -> bool:
        return (
            self.dead_letters_unexpected == 0
            and self.dead_letters_missing == 0
            and self.applied + self.ignored + self.bad == self.messages
        )

    def note(self, text: str) -> None:
        if len(self.notes) < MAX_EXAMPLES:
            self.notes.append(text)

    def violation(self, text: str, order: bool = False) -> None:
        if order:
            self.order_violations += 1
        else:
            self.violations += 1
        if len(self.violation_examples) < MAX_EXAMPLES:
            self.violation_examples.append(text)

    def to_dict(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "applied": self.applied,
            "ignored": self.ignored,
            "bad": self.bad,
            "bad_reasons": dict(self.bad_reasons),
            "dead_letters": self.dead_letters,
            "dead_letter_duplicates": self.dead_letter_duplicates,
            "dead_letters_unexpected": self.dead_letters_unexpected,
            "dead_letters_missing": self.dead_letters_missing,
            "directives": self.directives,
            "directive_duplicates": self.directive_duplicates,
            "expire_directives": self.expire_directives,
            "snapshot_requests": self.snapshot_requests,
            "alerts_raised": dict(self.alerts_raised),
            "alerts_cleared": dict(self.alerts_cleared),
            "clusters": self.clusters,
            "holds_checked": self.holds_checked,
            "excused_late_holds": self.excused_late_holds,
            "unsure_checks": self.unsure_checks,
            "basis_checked": self.basis_checked,
            "basis_unverified": self.basis_unverified,
            "basis_min_mismatches": self.basis_min_mismatches,
            "basis_not_topology": self.basis_not_topology,
            "members_records": self.members_records,
            "violations": self.violations,
            "order_violations": self.order_violations,
            "violation_examples": self.violation_examples,
            "longest_hold_ms": self.longest_hold_ms,
            "max_lag": self.max_lag,
            "lag_bound": self.lag_bound,
            "lag_samples": self.lag_samples,
            "first_wall_ms": self.first_wall_ms,
            "last_wall_ms": self.last_wall_ms,
            "safety_ok": self.safety_ok,
            "liveness_ok": self.liveness_ok,
            "accounting_ok": self.accounting_ok,
            "notes": self.notes,
        }


# -- the check --------------------------------------------------------------------------------
