"""``tailguard tune``'s engine: the raw model table, the grid of batch policies drawn from it,
the measurement of each point and the choice, and the plot."""
