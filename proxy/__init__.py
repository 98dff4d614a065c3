"""sealgate's egress proxy. What the sandbox runtime calls is here, standard library only:
importing it imports neither mitmproxy nor aiohttp nor cryptography
(tests/process/test_proxy_face.py), so a sandbox daemon stays small and starts fast.

    state = Path("var")                              # the proxy's --state
    register_source(control_socket(state), "10.200.0.2", "bot-1")
    unregister_source(control_socket(state), "10.200.0.2")
    ca_bundle_path(state)                            # the CA certificate a sandbox trusts

The proxy itself (the `sealgate proxy` process) is in request/ (every request's path), engine/
(mitmproxy's internals) and process/ (the processes around them); docs/architecture.md.
"""

from .errors import ProxyError
from .process.controlclient import (
    ControlError,
    SourceRefused,
    register_source,
    registered_sources,
    unregister_source,
)
from .process.statedir import ca_bundle_path, control_socket

__all__ = [
    "ControlError",
    "ProxyError",
    "SourceRefused",
    "ca_bundle_path",
    "control_socket",
    "register_source",
    "registered_sources",
    "unregister_source",
]
