"""The runtime's HTTP layer: the app and its routes, the loopback-only control routes, the
uvicorn protocol overrides below the app, and the per-connection bounds."""
