"""The SLO guard: windows from cumulative totals (:mod:`.observe`), the pure decision
(:mod:`.policy`), and its shells (:mod:`.local` in ``tailguard up``)."""
