"""``tailguard tune``'s engine: the raw model table, the grid of batch policies drawn from it,
the measurement of each point and the choice, and the plot."""

DEFAULT_BUDGET_S = 600.0
"""Default bound on a whole ``tailguard tune`` run, in seconds (here, not in
:mod:`tailguard.tune.search`, so that ``tailguard --help`` and every other command start
without importing what measuring needs)."""
