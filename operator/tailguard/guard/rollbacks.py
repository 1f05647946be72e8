"""The SLO guard's own metric: ``tailguard_rollbacks_total{model, reason}``.

Only the guard rolls traffic back, so the counter is declared here rather than in the runtime's
metrics. It is registered in prometheus_client's default registry, the one the runtime's
``/metrics`` serves: in ``tailguard up`` the guard runs in the runtime's process, so the counter
appears beside the runtime's own series.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import Counter

ROLLBACK_REASONS = ("latency", "deadline", "errors")
"""The breach kinds of :mod:`tailguard.guard.policy` (``Decision.breach``), in the order it
reports them; the ``reason`` label's values."""

ROLLBACKS = Counter("tailguard_rollbacks",
                    "Automatic rollbacks by the SLO guard, by the breach that caused them.",
                    ("model", "reason"))


def bind_rollbacks(model: str) -> Callable[[str], None]:
    """The rollback counter of one InferenceService: call the result with a reason from
    :data:`ROLLBACK_REASONS` to count one automatic rollback. Every reason is exported as 0
    from the start, so a dashboard's rate() has a series before the first rollback."""
    for reason in ROLLBACK_REASONS:
        ROLLBACKS.labels(model, reason)

    def count(reason: str) -> None:
        ROLLBACKS.labels(model, reason).inc()

    return count
