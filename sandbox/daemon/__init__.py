"""sandboxd: live sandboxes, the warm pool and lifetimes (daemon.py), a pool slot (slot.py), one
live sandbox on the event loop (session.py), the HTTP API (api.py, apiserver.py, serve.py) and the
self-test."""
