"""What `tailguard status` prints, from the data it fetched (pure formatting; the real CLI paths
are in tests/process/e2e/test_first_hour.py and tests/process/e2e/test_cli.py). No cluster runs here, so the
``--cluster`` lines are checked on InferenceService objects shaped as the API server returns
them: numbers the status does not hold are said to be absent, never made up."""

from __future__ import annotations

from typing import Any

from tailguard.cli.status import NO_OBSERVED, cluster_lines, live_lines

CONDITIONS = [{"type": "Ready", "status": "True", "reason": "Serving"},
              {"type": "SLOMet", "status": "Unknown", "reason": "NoGuard",
               "message": "the SLO guard is not running"}]


def isvc(status: dict[str, Any] | None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "tailguard.dev/v1alpha1", "kind": "InferenceService",
                           "metadata": {"name": "digits", "namespace": "ml"},
                           "spec": {"traffic": "fallback", "slo": {"p99LatencyMs": 50}}}
    if status is not None:
        obj["status"] = status
    return obj


def test_cluster_status_without_observed_numbers_says_so_and_shows_no_number() -> None:
    lines = cluster_lines(isvc({"activeModel": "primary", "replicaSummary": "2/2",
                                "url": "http://digits.ml.svc/v2/models/digits/infer",
                                "conditions": CONDITIONS}))
    assert lines[0] == "ml/digits: traffic -> primary (intent fallback)"
    assert "  SLOMet=Unknown (NoGuard): the SLO guard is not running" in lines
    assert lines[-1] == f"  {NO_OBSERVED}"
    assert not any("p99=" in line or "req/s=" in line for line in lines)


def test_cluster_status_with_observed_numbers_shows_them_against_the_slo() -> None:
    lines = cluster_lines(isvc({"activeModel": "primary", "observed": {
        "p99Ms": 12.4, "queueDepth": 0.3, "requestsPerSecond": 240, "errorRate": 0,
        "samples": 2400}}))
    assert lines[-1] == ("  observed: p99=12.4ms (SLO 50ms)  queue=0.3  req/s=240  errorRate=0  "
                         "samples=2400")


def test_cluster_status_shows_what_the_window_judged_and_left_out() -> None:
    lines = cluster_lines(isvc({"activeModel": "primary", "observed": {
        "p99Ms": 12.4, "queueDepth": 0.3, "requestsPerSecond": 240, "errorRate": 0,
        "samples": 2400, "judged": 2410, "excluded": {"short_deadline": 30}}}))
    assert lines[-1] == ("  observed: p99=12.4ms (SLO 50ms)  queue=0.3  req/s=240  errorRate=0  "
                         "samples=2400  judged=2410  excluded=30 (short_deadline=30)")


def test_cluster_status_shows_the_guard_and_its_rollback() -> None:
    lines = cluster_lines(isvc({"activeModel": "fallback", "observed": {
        "p99Ms": 20, "queueDepth": 0, "requestsPerSecond": 40, "errorRate": 0, "samples": 80,
        "unreadPods": ["digits-fallback-7d9-x2"]}, "guard": {
        "state": "rolledBack", "lastDecisionReason": "rolled back automatically (p99 high)",
        "rolledBackAt": "2026-12-05T17:00:00.250Z", "rollbackReason": "p99 high",
        "rolledBackModel": "builtin://digits/random-forest@1"}}))
    assert lines[-3:] == [
        "  pods not read in the last window: digits-fallback-7d9-x2",
        "  SLO guard: rolledBack: rolled back automatically (p99 high)",
        "  automatic rollback at 2026-12-05T17:00:00.250Z of builtin://digits/random-forest@1: "
        "p99 high (roll forward: tailguard rollforward digits --cluster)"]


def test_an_object_the_operator_never_touched_has_no_status_line() -> None:
    assert cluster_lines(isvc(None)) == [
        "ml/digits: traffic intent fallback; no status yet (is the tailguard operator running?)"]


def test_live_lines_without_traffic_show_no_latency() -> None:
    snap = {"windowSeconds": 10.0, "samples": 0, "p50Ms": None, "p95Ms": None, "p99Ms": None,
            "requestsPerSecond": 0.0, "errors": 0, "errorRate": 0.0,
            "rejected": {"queue_full": 2}, "rejectedTotal": 2, "queueDepth": 0}
    lines = live_lines({"name": "iris", "activeModel": "primary", "ready": True,
                        "sloP99Ms": 25.0, "lastSwitch": None,
                        "served": {"primary": {"uri": "builtin://iris/random-forest",
                                               "version": "1"}},
                        "models": {"primary": snap}})
    assert lines == [
        "iris: traffic -> primary, ready",
        "  primary (active): builtin://iris/random-forest version 1",
        "    p99=- (SLO 25ms): no admitted requests in the window",
        "    queue=0 rows  req/s=0  errors=0  rejected=2 (queue_full=2)  (last 10s)",
    ]


def test_live_lines_show_what_the_window_left_out_of_judgement() -> None:
    snap = {"windowSeconds": 10.0, "samples": 40, "p50Ms": 3.0, "p95Ms": 4.0, "p99Ms": 5.0,
            "requestsPerSecond": 4.0, "errors": 0, "errorRate": 0.0, "rejected": {},
            "rejectedTotal": 0, "judged": 40,
            "excluded": {"short_deadline": 7, "input_rejected": 2}, "queueDepth": 0}
    lines = live_lines({"name": "iris", "activeModel": "primary", "ready": True,
                        "sloP99Ms": 25.0, "models": {"primary": snap}})
    assert lines[-1] == ("    queue=0 rows  req/s=4  errors=0  rejected=0  judged=40  excluded=9 "
                         "(input_rejected=2, short_deadline=7)  (last 10s)")
