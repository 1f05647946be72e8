"""The SLO guard's decision: one pure function of the spec, the window history and the time.

:func:`decide` says, after each window, whether to do nothing, to call the load an overload
(scaling's job in a cluster; locally the runtime sheds with 429), or to roll traffic back to
the fallback because the primary itself breaks the SLO. ``tailguard up`` (:mod:`tailguard.guard.local`) and, in
the cluster part, the operator gather the inputs, call it and apply the result; the state it
needs (the automatic rollback in effect, the last action, when the guard was re-armed) is part
of its input, kept by the caller where a restart finds it (``status.guard`` in the cluster).

The rules (docs/guard.md, "The rules"):

* The guard judges the model, never its clients: a window counts only evidence the model
  controls. Left out, at the runtime (:data:`tailguard_runtime.stats.EXCLUDED_REASONS`): a
  504 or a deadline refusal of a request whose own deadline was shorter than the SLO (it asked
  for less than the SLO promises, so missing it cannot witness a breach), and a 422 for rows the
  model rejected (the client's input failed, not the model; the model ran on those rows alone or
  isolated them by bisection). A model that rejects everything is still judged: the runtime
  answers a 422 only while the model still answers a row it is known to take
  (:class:`tailguard_runtime.rows.ReferenceRow`); once it raises on that row too, its
  rejections are 500s, counted as errors. Refusals (429 ``queue_full``, 413) are never evidence
  of overload: a client can ask for a request that cannot fit whenever anything is queued;
  overload is judged from the work that was admitted (its queue depth and its wait, below).
* A window is judged on its admitted requests plus those refused for their deadline. Fewer
  than ``minSamples`` of them: ``Unknown`` (``InsufficientData``), never a breach. Such a
  window ends a streak of breached windows, unless admitted work waited through it
  (:data:`STALLED_QUEUE_DEPTH`): then the model was stalled, not idle, and the window neither
  counts toward a rollback nor ends the streak.
* A window is breached when more than 1% of the judged requests missed the SLO (slower than
  ``p99LatencyMs``, counted at the histogram's exact SLO edge, or refused for their deadline),
  or when more than ``maxErrorRate`` of the admitted requests failed. When more than half of the
  judged requests were refused for their deadline (429 ``deadline``) or timed out (504), the
  breach is named ``deadline``: a model too slow to answer anything, not an idle one.
* Overload explains a breach: mean queue depth per replica (rows of admitted requests
  waiting) above ``scaling.targetQueueDepth``, unless the model is slow on half-full batches
  (:data:`SLOW_SMALL_SHARE`) or, with no half-full call in the window, its mean call took
  longer than the SLO itself (a request in such a call misses the SLO with no queue ahead of
  it), or -- for a latency or deadline breach --
  queueing: the share of the window's model calls that took
  longer than half the SLO is at most a quarter of the share of judged requests that missed
  it. A request that waits for one call and then runs in the next misses the SLO only if a call
  takes more than half of it; when such calls are rare next to the slow requests, most slow
  requests waited behind several batches (in the queue, or in a saturated process or host),
  which more capacity fixes and a rollback does not. A slow model makes (nearly) every call
  slow. (This rule adds to the queue-depth rule: at capacity, or with the process itself
  saturated, requests wait before the batcher's queue and the queue depth stays under target
  while p99 breaks.) An overloaded window never counts
  toward a rollback.
* ``breachWindows`` consecutive breached windows of the primary that overload does not
  explain mean a broken model: with ``rollback.automatic`` roll back, otherwise report.
* No flapping: while an automatic rollback is in effect (and applies to the current primary) the
  effective intent is ``fallback`` and the guard takes no action; after an action it takes no
  other for ``recoverWindows x windowSeconds`` (the cooldown). A person rolls forward; a new
  primary model re-arms the guard. The guard never writes ``spec.traffic``.

Pure: no clock, no I/O, no logging.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tailguard.guard.observe import Observation
from tailguard.spec.resource import InferenceService
from tailguard_runtime.uris import shown

SLOW_FRACTION = 0.01
"""A window is breached when more than this share of judged requests missed the SLO: a p99
promise allows 1% (the definition of a 99th percentile)."""
DEADLINE_SHARE = 0.5
"""More than this share of judged requests refused for their deadline or timed out names the
breach ``deadline`` (a model that answers almost nothing in time)."""
QUEUEING_RATIO = 4.0
"""A latency or deadline breach is queueing (overload), not a slow model, when the share of
model calls longer than half the SLO is at most the share of judged requests that missed the
SLO divided by this."""
SLOW_SMALL_SHARE = 0.5
"""A queue deeper than ``targetQueueDepth`` does not explain a breach when more than this share
of the window's small model calls (at most half of ``maxBatchSize`` rows) took longer than the
SLO itself: every request in such a call misses the SLO with no queue ahead of it, which more
replicas would not change, and an overloaded model runs full batches, not half-full ones.
Without this, a client's large admitted requests (up to ``maxQueueSize`` rows, run whenever the
queue is empty) kept a broken primary's queue deep enough to block its rollback."""
STALLED_QUEUE_DEPTH = 1.0
"""A window with too few judged requests but a mean queue depth per replica of at least this
many rows is stalled, not idle: work waited all through it and finished too little to judge
(a slow model busy with a client's large admitted request finishes nothing for seconds).
Without this, such windows between breached ones kept a broken primary from being rolled
back."""
STALE_WINDOWS = 2.0
"""A latest window that ended more than this many window lengths before ``now`` is too old to
judge: the guard reports ``idle``/Unknown (no fresh data) instead of acting on it."""


class Action(enum.Enum):
    """What the caller should do."""

    NOTHING = "Nothing"
    OVERLOAD = "Overload"
    """Report overload; scaling (cluster) or shedding (local) is the answer, not a rollback."""
    ROLL_BACK = "RollBack"
    """Move traffic to the fallback and record an automatic rollback."""


@dataclass(frozen=True)
class GuardSpec:
    """The spec fields the decision reads. Units in the names; defaults are the CRD's."""

    p99_latency_ms: float
    window_seconds: float
    breach_windows: int = 3
    recover_windows: int = 6
    min_samples: int = 50
    max_error_rate: float = 0.01
    target_queue_depth: float = 8.0
    """Rows waiting per replica above which a window is overload (``scaling.targetQueueDepth``)."""
    automatic: bool = True
    traffic: str = "primary"
    """``spec.traffic``: the person's intent."""
    primary: str = ""
    """Identity of the primary model (``uri@version``): a rollback recorded for another one no
    longer applies (a new primary re-arms the guard)."""
    max_replicas: int = 1
    """Most replicas of a role (1 locally); only changes the wording of an overload."""

    @classmethod
    def from_service(cls, isvc: InferenceService, *, local: bool) -> "GuardSpec":
        """From a validated InferenceService; ``local``: one process, so no room to scale."""
        slo = isvc.slo
        return cls(float(slo.p99_latency_ms), float(slo.window_seconds), slo.breach_windows,
                   slo.recover_windows, slo.min_samples, slo.max_error_rate,
                   float(isvc.scaling.target_queue_depth), isvc.automatic_rollback,
                   isvc.traffic, model_identity(isvc.model.uri, isvc.model.version),
                   1 if local else isvc.scaling.max_replicas)

    @property
    def cooldown_s(self) -> float:
        """Seconds after an automatic action before the next: ``recoverWindows x windowSeconds``."""
        return self.recover_windows * self.window_seconds


@dataclass(frozen=True)
class Rollback:
    """An automatic rollback in effect (``status.guard.rolledBackAt`` and friends)."""

    at_s: float
    """When it happened (the caller's monotonic seconds)."""
    reason: str
    primary: str
    """The primary (``uri@version``) it was recorded for."""


@dataclass(frozen=True)
class History:
    """Everything the decision needs besides the spec and the time.

    ``windows``: observations of the role traffic went to, oldest first (the caller keeps the
    last few with :func:`remember`). ``rollback``: the automatic rollback in effect, if
    any. ``last_action_s``: the guard's last automatic action (monotonic s), for the cooldown.
    ``armed_s``: when the guard was last re-armed (a rollforward); earlier windows never count.
    """

    windows: tuple[Observation, ...] = ()
    rollback: Rollback | None = None
    last_action_s: float | None = None
    armed_s: float | None = None


@dataclass(frozen=True)
class Decision:
    """The outcome of one :func:`decide`: an action and a one-line reason, plus what status and
    the status line show.

    ``state``: ``ok``, ``breach``, ``overload``, ``rolledBack`` (also on the decision that rolls
    back), ``idle`` or ``manual`` (the CRD's ``status.guard.state``); ``breaches``: consecutive
    breached windows counted toward ``breach_windows``. ``slo_status``/``slo_reason``: the
    ``SLOMet`` condition (``True``/``False``/``Unknown``). ``breach``: the
    kind of the latest window's breach (``latency``, ``deadline``, ``errors``), else ``None``;
    with ``ROLL_BACK`` it is the reason label of ``tailguard_rollbacks_total``.
    """

    action: Action
    reason: str
    state: str
    breaches: int
    breach_windows: int
    slo_status: str
    slo_reason: str
    breach: str | None = None

    @property
    def label(self) -> str:
        """The state as the status line shows it: ``ok``, ``breach 1/3``, ``overload``,
        ``rolled back``, ``idle``, ``manual``."""
        if self.state == "breach":
            return f"breach {self.breaches}/{self.breach_windows}"
        return "rolled back" if self.state == "rolledBack" else self.state


def model_identity(uri: str, version: str) -> str:
    """``uri@version``: what a recorded rollback applies to, the URI as
    :func:`~tailguard_runtime.uris.shown` (a presigned URL's new signature is the same model)."""
    return f"{shown(uri)}@{version}"


def effective_traffic(spec: GuardSpec, history: History) -> str:
    """Where traffic should go: ``fallback`` when the person says so (``spec.traffic``) or while
    an automatic rollback recorded for the current primary is in effect; else ``primary``."""
    if spec.traffic == "fallback" or _rolled_back(spec, history):
        return "fallback"
    return "primary"


def decide(spec: GuardSpec, history: History, now_s: float) -> Decision:
    """Judge the latest window and decide.

    ``now_s`` is the caller's monotonic time in seconds (the same clock as the windows'
    ``end_s`` and the history's times). Never raises for well-formed inputs.
    """
    latest = history.windows[-1] if history.windows else None
    traffic = effective_traffic(spec, history)
    if latest is not None and (latest.end_s < now_s - STALE_WINDOWS * spec.window_seconds
                               or latest.role != traffic):
        latest = None  # too old, or of the role traffic just left: nothing fresh to judge
    verdict = _judge(spec, latest)
    slo_status, slo_reason, message = verdict.condition()

    def made(action: Action, reason: str, state: str, breaches: int = 0) -> Decision:
        return Decision(action, reason, state, breaches, spec.breach_windows, slo_status,
                        slo_reason, verdict.breach)

    if traffic == "fallback":
        if _rolled_back(spec, history):
            assert history.rollback is not None
            return made(Action.NOTHING, f"rolled back automatically ({history.rollback.reason}); "
                        f"traffic stays on the fallback until a person rolls forward; "
                        f"fallback: {message}", "rolledBack")
        return made(Action.NOTHING, f"traffic on the fallback by spec.traffic; fallback: "
                    f"{message}", "manual")
    if verdict.kind == "unknown":
        held = _streak(spec, history) if verdict.stalled else 0
        if held:
            return made(Action.NOTHING, f"{message}; breach {held}/{spec.breach_windows} holds",
                        "breach", held)
        return made(Action.NOTHING, message, "idle")
    if verdict.kind == "overload":
        return made(Action.OVERLOAD, message, "overload")
    if verdict.kind == "met":
        return made(Action.NOTHING, message, "ok")
    breaches = _streak(spec, history)
    if breaches < spec.breach_windows:
        return made(Action.NOTHING, f"breach {breaches}/{spec.breach_windows}: {message}",
                    "breach", breaches)
    over = f"{message}, {breaches} windows in a row"
    if not spec.automatic:
        return made(Action.NOTHING, f"the primary breaks the SLO ({over}); rollback.automatic "
                    "is false: reporting only", "breach", breaches)
    if history.last_action_s is not None and now_s - history.last_action_s < spec.cooldown_s:
        left = spec.cooldown_s - (now_s - history.last_action_s)
        return made(Action.NOTHING, f"the primary breaks the SLO ({over}); cooldown: no other "
                    f"automatic action for {left:.0f}s", "breach", breaches)
    return made(Action.ROLL_BACK, f"the primary breaks the SLO ({over})", "rolledBack", breaches)


@dataclass(frozen=True)
class _Verdict:
    kind: str  # met | breach | overload | unknown
    message: str
    breach: str | None = None
    breached: bool = False
    stalled: bool = False
    """Unknown, but work waited all through the window (:data:`STALLED_QUEUE_DEPTH`)."""

    def condition(self) -> tuple[str, str, str]:
        """``(status, reason, message)`` of the ``SLOMet`` condition."""
        if self.kind == "unknown":
            return "Unknown", "InsufficientData", self.message
        if not self.breached:
            return "True", "SLOMet", self.message
        if self.kind == "overload":
            return "False", "Overloaded", self.message
        return "False", f"{(self.breach or 'latency').capitalize()}Breached", self.message


def _judge(spec: GuardSpec, obs: Observation | None) -> _Verdict:
    if obs is None:
        return _Verdict("unknown", "no window to judge yet")
    slo = f"{spec.p99_latency_ms:g}ms"
    p99 = "-" if obs.p99_ms is None else f"{obs.p99_ms:g}ms"
    if obs.judged < spec.min_samples:
        if obs.queue_depth >= STALLED_QUEUE_DEPTH:
            return _Verdict("unknown", f"{obs.judged} requests finished in the last "
                            f"{obs.window_s:g}s while {obs.queue_depth:.1f} rows/replica "
                            f"waited, fewer than minSamples={spec.min_samples}: stalled, too "
                            "little to judge", stalled=True)
        return _Verdict("unknown", f"{obs.judged} requests in the last {obs.window_s:g}s, fewer "
                        f"than minSamples={spec.min_samples}: too little traffic to judge")
    breach: str | None = None
    if (obs.deadline_refused + obs.timeouts) > DEADLINE_SHARE * obs.judged:
        breach = "deadline"
        what = (f"{obs.deadline_refused + obs.timeouts} of {obs.judged} requests refused for "
                f"their deadline or timed out")
    elif obs.admitted and obs.error_rate > spec.max_error_rate:
        breach = "errors"
        what = (f"error rate {obs.error_rate:.1%} > maxErrorRate {spec.max_error_rate:g} "
                f"({obs.errors} of {obs.admitted})")
    elif obs.slow_fraction > SLOW_FRACTION:
        breach = "latency"
        what = (f"p99={p99} > {slo}: {obs.slow_fraction:.1%} of {obs.judged} requests slower "
                f"than the SLO")
    else:
        what = f"p99={p99} <= {slo} over {obs.judged} requests"
    overload = _overload(spec, obs, breach)
    if overload is not None:
        return _Verdict("overload", f"overload: {overload}" + (f" (explains {what})" if breach
                                                                else f"; {what}"),
                        breach, breach is not None)
    if breach is None:
        return _Verdict("met", what)
    return _Verdict("breach", what, breach, True)


def _overload(spec: GuardSpec, obs: Observation, breach: str | None) -> str | None:
    answer = ("scaling's job" if obs.replicas < spec.max_replicas
              else "shedding with 429 is the answer on one machine" if spec.max_replicas == 1
              else f"at maxReplicas={spec.max_replicas}; shedding with 429")
    if obs.queue_depth > spec.target_queue_depth:
        if breach is not None and _slow_model(spec, obs):
            return None  # its calls alone miss the SLO: a slow model, whatever its queue
        return (f"queue {obs.queue_depth:.1f} rows/replica > targetQueueDepth "
                f"{spec.target_queue_depth:g}, {answer}")
    if (breach in ("latency", "deadline") and obs.calls
            and obs.slow_calls / obs.calls <= obs.slow_fraction / QUEUEING_RATIO):
        return (f"queueing: {obs.slow_calls} of {obs.calls} model calls took over "
                f"{spec.p99_latency_ms / 2:g}ms (half the SLO; mean {obs.model_ms:g}ms), so "
                f"most slow requests waited behind other work, {answer}")
    return None


def _slow_model(spec: GuardSpec, obs: Observation) -> bool:
    """Whether the window's model calls alone miss the SLO: more than half of its half-full
    calls took longer than the SLO (:data:`SLOW_SMALL_SHARE`), or, with no half-full call to
    tell (a queue kept deep keeps every batch full), its mean call did. A full batch longer
    than the SLO breaks the promise at any load that fills batches; ``tailguard tune`` never
    picks such a batch size."""
    if obs.small_calls:
        return obs.small_calls_over_slo > SLOW_SMALL_SHARE * obs.small_calls
    return obs.model_ms is not None and obs.model_ms > spec.p99_latency_ms


def _streak(spec: GuardSpec, history: History) -> int:
    """Consecutive breached primary windows at the end of the history (overload, idle and met
    windows, fallback windows and windows before the last re-arm all end the streak; stalled
    windows are passed over), at most ``breach_windows``."""
    count = 0
    for obs in reversed(history.windows):
        if count == spec.breach_windows:
            break
        if obs.role != "primary" or (history.armed_s is not None and obs.end_s <= history.armed_s):
            break
        verdict = _judge(spec, obs)
        if verdict.stalled:
            continue
        if verdict.kind != "breach":
            break
        count += 1
    return count


def _rolled_back(spec: GuardSpec, history: History) -> bool:
    return history.rollback is not None and history.rollback.primary == spec.primary


def remember(spec: GuardSpec, history: History, window: Observation) -> History:
    """``history`` with ``window`` appended, keeping the last ``2 x breach_windows`` windows
    (what :func:`decide` reads: a streak with stalled windows in it; a longer stall hides the
    breaches before it, so the guard errs toward no rollback)."""
    keep = 2 * max(spec.breach_windows, 1)
    return History((*history.windows, window)[-keep:], history.rollback, history.last_action_s,
                   history.armed_s)


def applied(spec: GuardSpec, history: History, decision: Decision, now_s: float) -> History:
    """``history`` after the caller carried out ``decision`` at ``now_s`` (monotonic s): a
    rollback is recorded for the current primary, and starts the cooldown."""
    if decision.action is not Action.ROLL_BACK:
        return history
    return History(history.windows, Rollback(now_s, decision.reason, spec.primary), now_s,
                   history.armed_s)


def rolled_forward(history: History, now_s: float) -> History:
    """``history`` after a person rolled forward at ``now_s`` (monotonic s): the rollback record
    is cleared and the guard re-armed (windows before ``now_s`` never count); the cooldown of
    the last action still holds."""
    return History(history.windows, None, history.last_action_s, now_s)
