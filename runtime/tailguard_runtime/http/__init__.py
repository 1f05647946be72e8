"""The runtime's HTTP layer: the app and its routes, the loopback-only control routes, the
uvicorn protocol overrides below the app, the per-connection bounds and the pool of connections
they share, the refusal of web pages, and the one error writer all of them answer errors
through."""
