"""The Kubernetes operator: kopf and nothing else (handlers, resync, reconcile rules, manifests,
status, the one Kubernetes client module, quantities, settings)."""
