"""The watch cache: newer bodies win by resourceVersion, deletions leave tombstones, and a
seed replaces what a namespace held of a kind."""

from __future__ import annotations

from typing import Any

from tailguard.operator.cache import WatchCache


def obj(name: str, version: str, kind: str = "Service", namespace: str = "ns",
        **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": name, "namespace": namespace,
                                       "resourceVersion": version}, **extra}


def test_an_older_body_never_replaces_a_newer_one() -> None:
    cache = WatchCache()
    cache.keep(obj("a", "10", spec=1))
    cache.keep(obj("a", "9", spec=0))  # a watch event of an earlier write, delivered late
    assert cache.get("Service", "ns", "a") == obj("a", "10", spec=1)
    cache.keep(obj("a", "11", spec=2))
    assert cache.get("Service", "ns", "a") == obj("a", "11", spec=2)


def test_a_deleted_object_is_not_brought_back_by_a_late_body() -> None:
    cache = WatchCache()
    cache.keep(obj("a", "10"))
    cache.drop(obj("a", "12"))
    cache.keep(obj("a", "11"))  # the answer of a write made before the deletion
    assert cache.get("Service", "ns", "a") is None
    cache.keep(obj("a", "20"))  # created again
    assert cache.get("Service", "ns", "a") == obj("a", "20")


def test_versions_that_are_not_integers_let_the_latest_win() -> None:
    cache = WatchCache()
    cache.keep(obj("a", "b7"))
    cache.keep(obj("a", "a1", spec=1))
    assert cache.get("Service", "ns", "a") == obj("a", "a1", spec=1)


def test_a_seed_replaces_a_kind_in_a_namespace_and_keeps_what_is_newer_than_the_list() -> None:
    cache = WatchCache()
    assert not cache.seeded("ns")
    cache.keep(obj("missed-deletion", "5"))
    cache.keep(obj("created-after-the-list", "30"))
    cache.keep(obj("newer-than-listed", "25"))
    cache.keep(obj("other-namespace", "5", namespace="elsewhere"))
    cache.keep(obj("other-kind", "5", kind="ConfigMap"))
    cache.seed("ns", {"Service": ([obj("listed", "15"), obj("newer-than-listed", "18")], "20")})
    assert cache.seeded("ns") and not cache.seeded("elsewhere")
    assert cache.get("Service", "ns", "missed-deletion") is None
    assert cache.get("Service", "ns", "listed") == obj("listed", "15")
    assert cache.get("Service", "ns", "created-after-the-list") == obj("created-after-the-list",
                                                                       "30")
    assert cache.get("Service", "ns", "newer-than-listed") == obj("newer-than-listed", "25")
    assert cache.get("Service", "elsewhere", "other-namespace") is not None
    assert cache.get("ConfigMap", "ns", "other-kind") is not None  # not listed: left alone


def test_managed_fields_are_not_kept() -> None:
    cache = WatchCache()
    body = obj("a", "1")
    body["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    cache.keep(body)
    assert "managedFields" not in cache.get("Service", "ns", "a")["metadata"]  # type: ignore[index]
    assert "managedFields" in body["metadata"]  # the caller's object is left as it was


def test_bodies_that_are_mappings_but_not_dicts_are_kept() -> None:
    """kopf hands handlers a ``Body``, a read-only mapping over the event's object."""
    import kopf

    cache = WatchCache()
    cache.keep(kopf.Body(obj("a", "3", spec={"x": [1, 2]})))
    assert cache.get("Service", "ns", "a") == obj("a", "3", spec={"x": [1, 2]})


def test_objects_are_found_by_their_group_label() -> None:
    cache = WatchCache(group_label="svc")
    for name, version, namespace, svc in (("iris-primary-5d9f", "4", "ns", "iris"),
                                          ("iris-fallback-77aa", "5", "ns", "iris"),
                                          ("iris-x", "6", "other", "iris"),
                                          ("irises-primary-1", "7", "ns", "irises")):
        body = obj(name, version, kind="ConfigMap", namespace=namespace)
        body["metadata"]["labels"] = {"svc": svc}
        cache.keep(body)
    cache.keep(obj("unlabelled", "8", kind="ConfigMap"))

    def grouped(group: str, namespace: str = "ns") -> list[str]:
        return sorted(o["metadata"]["name"] for o in cache.grouped("ConfigMap", namespace, group))

    assert grouped("iris") == ["iris-fallback-77aa", "iris-primary-5d9f"]
    assert grouped("irises") == ["irises-primary-1"] and grouped("iris", "other") == ["iris-x"]
    assert cache.grouped("Service", "ns", "iris") == []
    relabelled = obj("irises-primary-1", "9", kind="ConfigMap")
    relabelled["metadata"]["labels"] = {"svc": "iris"}
    cache.keep(relabelled)
    assert grouped("irises") == [] and "irises-primary-1" in grouped("iris")
    cache.drop(obj("iris-fallback-77aa", "10", kind="ConfigMap"))
    cache.seed("ns", {"ConfigMap": ([relabelled], "11")})  # the list lacks iris-primary-5d9f
    assert grouped("iris") == ["irises-primary-1"]
    assert grouped("iris", "other") == ["iris-x"]
