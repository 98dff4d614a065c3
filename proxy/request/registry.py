"""Source address -> sandbox, for traffic that carries no credentials (transparent mode).

The sandbox runtime registers each sandbox's address through the control API. The map lives in
one small JSON file under the state directory, replaced atomically on every change, so any number
of proxy worker processes see the same map: a reader stats the file on lookup (one syscall) and
re-reads it only when it changed. That keeps registration synchronous: once the control API has
answered, the next connection from that address is attributed, in every worker.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from sealgate.reasons import Reason
from sealgate.watch import Snapshot

from ..errors import ProxyError

log = logging.getLogger("sealgate")
# Every registry's versions from one count: a rules reload makes a new registry, and a version
# an open connection kept from the old one must never equal one of the new one's.
_VERSIONS = itertools.count(1)



class RegistryError(ProxyError, ValueError):
    """A registration that cannot be accepted: its address is not an IP address."""

    reason = Reason.BAD_ADDRESS


def canonical_source(address: str) -> str:
    """The key for an address: compressed form, IPv4-mapped IPv6 folded to IPv4."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError as exc:
        raise RegistryError(f"not an IP address: {address[:64]!r}") from exc
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


class SourceRegistry:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen = Snapshot.unread((path,))
        self._map: dict[str, str] = {}
        self.version = next(_VERSIONS)

    def lookup(self, address: str) -> str | None:
        self._refresh()
        try:
            return self._map.get(canonical_source(address))
        except RegistryError:
            return None

    def entries(self) -> Mapping[str, str]:
        self._refresh()
        return dict(self._map)

    def register(self, address: str, sandbox: str) -> None:
        entries = dict(self.entries())
        entries[canonical_source(address)] = sandbox
        self._write(entries)

    def unregister(self, address: str) -> bool:
        entries = dict(self.entries())
        found = entries.pop(canonical_source(address), None) is not None
        if found:
            self._write(entries)
        return found

    def _refresh(self) -> None:
        now = self._seen.now()
        if not self._seen.changed(now):
            return
        if now == (None,):
            # No registry (yet), or none we can stat: nobody is attributed.
            self._replace({})
            self._seen = self._seen.retake(now)
            return
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            # A registry we cannot read attributes nobody: unattributed traffic falls to the
            # default policy, which denies unless an operator chose otherwise.
            if now != self._seen.identities:
                log.error("source registry unreadable; no source attributed",
                          extra={"path": str(self.path), "error_type": type(exc).__name__})
            self._replace({})
            self._seen = self._seen.retake(now)
            return
        sources = data.get("sources", {}) if isinstance(data, dict) else {}
        valid = isinstance(sources, dict)
        self._replace({str(k): str(v) for k, v in sources.items()} if valid else {})
        self._seen = self._seen.retake(now)

    def _replace(self, entries: dict[str, str]) -> None:
        if entries != self._map:
            self._map = entries
            self.version = next(_VERSIONS)

    def version_now(self) -> int:
        """A number that changes whenever the map does (one stat when it has not): what an
        open connection compares to know whether its address's sandbox may have changed."""
        self._refresh()
        return self.version

    def _write(self, entries: Mapping[str, str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".registry-")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump({"version": 1, "sources": dict(sorted(entries.items()))}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        self._refresh()
