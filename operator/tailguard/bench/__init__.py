"""Load against a served InferenceService: the generator (:func:`tailguard.bench.loadgen.run_load`
is the documented Python API), a load test's arithmetic, the server's view from ``/metrics``,
and a served copy of a spec to measure (what ``tune`` and ``report`` share)."""
