"""``tailguard operator`` without a cluster: what it hands kopf."""

from __future__ import annotations

from typing import Any

import pytest


def test_run_operator_hands_kopf_its_scope(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tailguard operator`` is kopf.run with the namespaces, peering and settings given."""
    import kopf

    from tailguard.operator import handlers
    from tailguard.operator.settings import OperatorSettings

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(kopf, "configure", lambda **kwargs: None)
    monkeypatch.setattr(kopf, "run", lambda **kwargs: calls.append(kwargs))
    served: list[int] = []
    monkeypatch.setattr(handlers, "start_http_server", served.append)
    for variable in ("TAILGUARD_METRICS_PORT", "TAILGUARD_GUARD"):
        monkeypatch.delenv(variable, raising=False)
    handlers.run_operator(None, settings=OperatorSettings(metrics_port=0))
    assert served == [] and calls.pop()["memo"].tailguard.metrics_port == 0
    settings = OperatorSettings(runtime_image="registry.example/rt:1")
    handlers.run_operator(["team-a", "team-b"], settings=settings)
    handlers.run_operator(None, peering="tailguard", liveness_endpoint="http://0.0.0.0:8080/h")
    handlers.run_operator(None, peering="")  # what the chart passes without peering
    first, second, third = calls
    assert served == [8081, 8081, 8081]  # the operator's /metrics, on by default
    assert (first["clusterwide"], first["namespaces"], first["standalone"]) == \
        (False, ["team-a", "team-b"], True)
    assert first["memo"].tailguard == settings
    assert (second["clusterwide"], second["standalone"], second["peering_name"]) == \
        (True, False, "tailguard")
    assert second["liveness_endpoint"] == "http://0.0.0.0:8080/h"
    # Any peering name, even "", makes kopf's peering mandatory and pauses every watch.
    assert (third["standalone"], third["peering_name"]) == (True, None)


def test_the_operators_tables_are_made_once_and_shared_by_every_objects_memo() -> None:
    """kopf hands each object's handlers a shallow copy of the operator's memo: the tables the
    handlers share (known services, the watch cache, the pod index, the children seen) must
    exist in it before the first copy, or each object would get tables of its own (a
    300-service run held 3,000 tables of children seen, one per child)."""
    import copy

    import kopf

    from tailguard.operator import handlers
    from tailguard.operator.settings import OperatorSettings

    memo = kopf.Memo(tailguard=OperatorSettings())
    handlers.configure(settings=kopf.OperatorSettings(), memo=memo)
    one, other = copy.copy(memo), copy.copy(memo)
    for table in (handlers._known, handlers._cache, handlers._pods, handlers._seen):
        assert table(one) is table(other) is table(memo), table.__name__
