"""Where things are in the proxy's state directory (`--state`), for the proxy and for whoever
finds it there: the sandbox runtime reaches the control API through its socket and gives its
sandboxes the CA certificate to trust. Standard library only (the proxy's face uses it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

CA_BASENAME: Final = "mitmproxy"  # mitmproxy's TlsConfig looks for <confdir>/mitmproxy-ca.pem


def confdir(state: Path) -> Path:
    """mitmproxy's configuration directory: the interception CA, in mitmproxy's names."""
    return state / "ca"


def ca_paths(confdir: Path) -> tuple[Path, Path]:
    """(key+cert file, cert-only file)."""
    return confdir / f"{CA_BASENAME}-ca.pem", confdir / f"{CA_BASENAME}-ca-cert.pem"


def ca_bundle_path(state: Path) -> Path:
    """The CA certificate (no key) a client of the proxy trusts; the proxy makes it on its first
    start (process/ca.py)."""
    return ca_paths(confdir(state))[1]


def control_socket(state: Path) -> Path:
    """Where the control API listens."""
    return state / "control.sock"
