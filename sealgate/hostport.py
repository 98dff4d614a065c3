"""`host:port` as logs, URLs and command lines write it: an IPv6 address goes in brackets.

Not a grammar for what a client sends: request authorities are `hostname.split_authority`'s,
which canonicalises the host and is strict about every character. These are for addresses the
operator typed or the proxy itself chose.
"""

from __future__ import annotations

__all__ = ["format_hostport", "parse_hostport"]


def format_hostport(host: str, port: int) -> str:
    """`host:port`, or `[host]:port` for an IPv6 address (any host with a ':' in it)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_hostport(text: str) -> tuple[str, int]:
    """A command line's `HOST:PORT` or `[IPV6]:PORT`: the host without its brackets (empty for
    `:PORT`) and the port, 0-65535 in decimal. The port is what follows the last ':', so an
    IPv6 address written without brackets still parses. ValueError when there is no port."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    # isdigit alone admits other scripts' digits ('²'), which int() then refuses.
    if not sep or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT or [IPV6]:PORT, got {text[:100]!r}")
    return host, int(port)
