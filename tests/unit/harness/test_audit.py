"""The audit log reader, on a file written the way the API server writes it: one JSON event
per line, appended while the tests read. A mark taken while an event is half written must
neither fail the next read nor count that event as after the mark."""

from __future__ import annotations

import json
from pathlib import Path

from harness.kube.audit import AuditLog


def event(verb: str, name: str) -> bytes:
    return json.dumps({"verb": verb, "user": {"username": "u"},
                       "objectRef": {"resource": "pods", "namespace": "n", "name": name},
                       "responseStatus": {"code": 200}}).encode() + b"\n"


def test_a_mark_inside_an_event_being_written_leaves_that_event_out(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    before, during, after = event("create", "a"), event("patch", "b"), event("delete", "c")
    half = len(during) // 2
    path.write_bytes(before + during[:half])
    log = AuditLog(path)
    mark = log.mark()
    assert log.writes(mark) == []  # the half-written event is not read
    with open(path, "ab") as fh:
        fh.write(during[half:])
    assert log.writes(mark) == []  # it was being written at the mark: before it
    with open(path, "ab") as fh:
        fh.write(after)
    assert [(w.verb, w.name) for w in log.writes(mark)] == [("delete", "c")]
    assert [(w.verb, w.name) for w in log.writes(0)] == [
        ("create", "a"), ("patch", "b"), ("delete", "c")]
    at_a_line_end = len(before)
    assert [w.name for w in log.writes(at_a_line_end)] == ["b", "c"]
