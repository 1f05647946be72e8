"""``tailguard up``: one InferenceService served on this machine, no cluster (the serve loop,
the control file it leaves for the CLI, and a ``tailguard up`` run as a child process)."""
