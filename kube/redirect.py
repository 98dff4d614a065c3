"""`sealgate kube redirect`: a pod's egress sent to its forwarder, as a service mesh's init
container sends it to its sidecar.

Run once in the pod's network namespace (an init container with NET_ADMIN and nothing else),
before any other container starts. The table, in the `inet` family so IPv4 and IPv6 alike:

- **nat, output**: every TCP connection a process of the pod opens leaves for the forwarder's
  port on the loopback (`forward.py`), whatever address it dialed, except the loopback's own
  traffic (the pod's own servers) and the forwarder's own connections (its uid: the one way to
  tell them apart, as Istio's 1337);
- **filter, output**: nothing else leaves: no UDP (so no QUIC, which the proxy would never
  see, and no DNS unless `--dns` lets the pod's resolver be asked), no ICMP, no raw socket's
  packet; only the loopback, the forwarder's uid and replies to what was accepted.

The pod's NetworkPolicy still lets it reach the proxy Service alone: this table is what makes
a client that ignores `HTTPS_PROXY` go through the proxy anyway instead of failing, and a
second wall if the policy engine is absent or wrong.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from sealgate.reasons import SealgateError

__all__ = ["TABLE", "Redirect", "RedirectError"]

TABLE = "sealgate_redirect"


class RedirectError(SealgateError, RuntimeError):
    """The table could not be installed; the pod must not start without it."""


@dataclass(frozen=True)
class Redirect:
    port: int  # the forwarder's, on the loopback
    exempt_uid: int  # the forwarder's uid: its connections go out as they are
    dns: bool = False  # the pod's resolver may be asked (UDP and TCP port 53)

    def ruleset(self) -> str:
        """The nftables script: replaces a table of the same name, so that running it again
        (a restarted init container) leaves exactly one."""
        dns_udp = "  udp dport 53 accept\n" if self.dns else ""
        dns_tcp = "  tcp dport 53 return\n" if self.dns else ""
        return (
            f"table inet {TABLE}\n"
            f"delete table inet {TABLE}\n"
            f"table inet {TABLE} {{\n"
            " chain nat_out {\n"
            "  type nat hook output priority -100; policy accept;\n"
            '  oifname "lo" return\n'
            f"  meta skuid {self.exempt_uid} return\n"
            f"{dns_tcp}"
            f"  meta l4proto tcp redirect to :{self.port}\n"
            " }\n"
            " chain filter_out {\n"
            "  type filter hook output priority filter; policy drop;\n"
            '  oifname "lo" accept\n'
            # A redirected connection's first packet still names the link it was routed to
            # before the redirect: its conntrack entry says it was redirected.
            "  ct status dnat accept\n"
            f"  meta skuid {self.exempt_uid} accept\n"
            "  ct state established,related accept\n"
            f"{dns_udp}"
            f"{dns_tcp.replace('return', 'accept')}"
            " }\n"
            "}\n"
        )

    def install(self, nft: str = "nft") -> None:
        """Applied atomically (`nft -f`: all of it or nothing)."""
        try:
            done = subprocess.run([nft, "-f", "-"], input=self.ruleset(), text=True,
                                  capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RedirectError(f"cannot run {nft}: {exc}") from None
        if done.returncode != 0:
            said = done.stderr.strip().splitlines()
            raise RedirectError(f"nft refused the table: {said[0] if said else done.returncode}")
