"""The evidence card as Markdown, rendered from the dict :func:`tailguard.report.gather.gather` measured.

Pure: the same dict gives the same text; two runs give the same headings and tables with their
own numbers. Nothing here is written unless it came from the measured dict.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from tailguard._util.markdown import table as markdown_table
from tailguard.tune.rawtable import RawRow, markdown

LOCAL_PORT = 8080
"""The port the example ``curl`` line names: ``tailguard up``'s default."""


def render(doc: dict[str, Any]) -> str:
    """``report.md`` for the measured ``doc``."""
    name = doc["service"]["name"]
    parts = [f"# Evidence card: InferenceService `{name}`", "",
             f"Measured by `tailguard report` at {doc['measuredAt']} against its own "
             f"`tailguard up` ({doc['contract']['base']}); every number below comes from this "
             "run.", ""]
    parts += _runtime(doc["runtime"])
    parts += _contract(name, doc["contract"])
    parts += _latency(doc["latency"], doc.get("plots", []))
    parts += _failures(doc["failureChecks"])
    parts += _rollback(name, doc["rollback"])
    return "\n".join(parts) + "\n"


def _table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    return [markdown_table(head, rows), ""]


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _runtime(rt: dict[str, Any]) -> list[str]:
    m = rt["machine"]
    out = ["## Runtime choice", "", "### Versions", ""]
    out += _table(["component", "version"], rt["versions"].items())
    out += ["### Models", ""]
    out += _table(["role", "URI", "class", "features", "classes", "size (pickled)", "structure"],
                  [(d["role"], f"`{d['uri']}`", d["class"], d["features"], d["classes"],
                    f"{d['sizeBytes'] / 1024:,.0f} KiB" if "sizeBytes" in d else None,
                    _structure(d)) for d in rt["models"]])
    out += ["### Machine", ""]
    out += _table(["", ""], [("platform", m["platform"]), ("CPU", m["cpu"]),
                             ("cores (usable)", f"{m['cores']} ({m['usableCores']})"),
                             ("memory", None if m["memoryGiB"] is None
                              else f"{m['memoryGiB']} GiB"),
                             ("load average (1 min) when measured", m["loadAverage1m"])])
    return out


def _structure(d: dict[str, Any]) -> str | None:
    if "trees" in d:
        return f"{d['trees']} trees, {d['nodes']:,} nodes"
    if "steps" in d:
        return " -> ".join(d["steps"])
    return None


def _contract(name: str, c: dict[str, Any]) -> list[str]:
    ex = c["example"]
    out = ["## Request contract", "", "### Endpoints (status measured now)", ""]
    out += _table(["method", "path", "status"],
                  [(e["method"], f"`{e['path']}`", e["status"]) for e in c["endpoints"]])
    out += ["### Example request and its real reply", "",
            f"One row from {c['rowsSource']}, Open Inference Protocol v2 (`tailguard up` "
            f"serves on port {LOCAL_PORT} by default):", "", "```bash",
            f"curl -s -X POST http://127.0.0.1:{LOCAL_PORT}{ex['path']} "
            f"-H 'Content-Type: application/json' -d '{ex['body']}'", "```", "",
            f"Reply: **{ex['status']}** in {ex['elapsedMs']:.2f} ms (client side), headers "
            + ", ".join(f"`{k}: {v}`" for k, v in sorted(ex["replyHeaders"].items())) + ":",
            "", "```json", ex["reply"], "```", "",
            f"KServe v1 (`POST {c['v1Example']['path']}`, `{{\"instances\": [[...]]}}`) answered "
            f"**{c['v1Example']['status']}**: `{c['v1Example']['reply']}`", "",
            "### Error shapes (each sent now)", ""]
    out += _table(["what was sent", "expected", "status", "reply body", "as expected"],
                  [(e["name"], e["expected"], e["status"],
                    f"`{e['reply']}`" if e["reply"] else None, "yes" if e["passed"] else "NO")
                   for e in c["errors"]])
    return out


def _latency(lat: dict[str, Any], plots: list[str]) -> list[str]:
    b = lat["batching"]
    load = lat["load"]
    out = ["## Latency and cost", "",
           f"Configured policy: `maxBatchSize: {b.get('maxBatchSize')}`, `maxWaitMs: "
           f"{b.get('maxWaitMs')}`, `maxQueueSize: {b.get('maxQueueSize')}`, `timeoutMs: "
           f"{b.get('timeoutMs')}`; SLO p99 {lat['sloP99Ms']} ms.", "",
           f"### Under load (open loop, Poisson arrivals, one row per request, "
           f"{load['durationS']:g} s measured per rate after {load['warmupS']:g} s)", ""]
    rate = load["rateAtSloRps"]
    out += _table(["rate at SLO", "throughput", "p50", "p95", "p99", "meets the SLO"],
                  [(f"{rate:g} req/s" if rate is not None else "none held",
                    f"{load['throughputRps']:,.0f} req/s", _ms(load["p50Ms"]),
                    _ms(load["p95Ms"]), _ms(load["p99Ms"]), "yes" if load["meetsSlo"] else "no")])
    out += [f"Sweep: {load['sweep']}.", ""]
    runs = (load.get("detail") or {}).get("runs", [])
    out += _table(["offered", "achieved", "p50", "p99", "max", "not 200", "valid"],
                  [(f"{r['offered_rps']:g} req/s", f"{r['achieved_rps']:,.0f} req/s",
                    _ms(r["latency_ms"].get("p50")), _ms(r["latency_ms"].get("p99")),
                    _ms(r["latency_ms"].get("max")), r["sent"] - r["ok"],
                    "yes" if r["valid"] else "no: " + "; ".join(r["invalid"])) for r in runs])
    out += [f"![{p}]({p})\n" for p in plots if p == "load.png"]
    out += ["### Raw model, in process (one thread, no server)", ""]
    for role, rows in lat["rawTables"].items():
        out += [f"{role}:", "", markdown([RawRow(**r) for r in rows]), ""]
    out += [f"![{p}]({p})\n" for p in plots if p != "load.png"]
    return out


def _failures(checks: list[dict[str, Any]]) -> list[str]:
    out = ["## Failure checks (each run now)", ""]
    out += _table(["check", "expected", "as expected", "what happened"],
                  [(c["name"], c["expected"], "yes" if c["passed"] else "NO", c["happened"])
                   for c in checks])
    return out


def _rollback(name: str, rb: dict[str, Any]) -> list[str]:
    fb, auto, by_hand = rb["fallback"], rb["automatic"], rb["byHand"]
    rows = {r["batch"]: r for r in fb["rawTable"]}
    one = rows.get(1)
    out = ["## Rollback plan", "", f"Fallback model: `{fb['uri']}`.", ""]
    out += _table(["fallback latency", "measured"], [
        ("one call of 1 row, in process (median)", _ms(one["median_ms"] if one else None)),
        ("one call of 512 rows, in process (median)",
         _ms(rows[512]["median_ms"] if 512 in rows else None)),
        ("served, one request at a time (median)", _ms(fb.get("servedMedianMs"))),
        ("served, one request at a time (max)", _ms(fb.get("servedMaxMs")))])
    out += ["By hand, on this machine (`tailguard up`):", "", "```bash",
            *by_hand["local"], "```", "", "In a cluster:", "", "```bash", *by_hand["cluster"],
            "```", ""]
    if auto["enabled"]:
        out += [f"Automatic (the SLO guard, `rollback.automatic: true`): every "
                f"{auto['windowSeconds']:g} s window with at least {auto['minSamples']} judged "
                f"requests is breached when more than {100 * auto['slowFraction']:g}% of them "
                f"are slower than {auto['p99LatencyMs']:g} ms (or refused for their deadline), "
                f"or more than {100 * auto['maxErrorRate']:g}% fail. Only what the model "
                f"controls is judged: a deadline shorter than the SLO, or rows the model "
                f"rejected while it still answers a row it answered before, are the clients' "
                f"own. A breach that overload explains "
                f"(mean queue depth of admitted work above {auto['targetQueueDepth']:g} rows, "
                f"or slow requests that are queueing rather than slow model calls) never "
                f"counts. After "
                f"{auto['breachWindows']} consecutive breached windows traffic moves to the "
                f"fallback; no other automatic action for {auto['recoverWindows']} windows; "
                f"a person rolls forward (`tailguard rollforward {name}`).", ""]
    else:
        out += ["Automatic: off (`rollback.automatic: false`); the SLO guard only reports.", ""]
    guard = rb["guardNow"].get("guard", {})
    out += [f"The guard when measured: active model `{rb['guardNow'].get('activeModel')}`, "
            + (f"state `{guard['state']}`" if "state" in guard else
               f"no window judged yet (the first closes {auto['windowSeconds']:g} s after start)")
            + (f", last decision: {guard['lastDecisionReason']}"
               if guard.get("lastDecisionReason") else "") + "."]
    return out
