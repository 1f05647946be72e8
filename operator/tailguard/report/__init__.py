"""``tailguard report``'s engine: the evidence card of a service, measured and rendered."""
