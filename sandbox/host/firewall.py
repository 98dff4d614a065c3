"""The rules that make the proxy a sandbox's only way out, in the host's nftables.

One table per sandbox (`inet sealgate_<n>`), loaded and removed in one transaction each, so a
sandbox is never half-filtered. For packets from the sandbox's link:

- the source must be the sandbox's own address (it cannot pose as another sandbox, whose
  address the proxy identifies it by); IPv6 is dropped outright;
- TCP to the gateway's proxy ports is accepted, and DNS to the host end of the link (the
  sandbox's own name server, `sandbox.host.dns`, which forwards nothing), at most `dns.RATE`
  packets a second however many sockets send them; any other TCP connection
  is redirected to the proxy's transparent port, where the proxy names the destination by SNI
  or Host and decides like any other request; everything else (other UDP, QUIC, ICMP, other
  ports of the gateway or the host) is dropped;
- nothing is forwarded to or from the link, whatever the host's ip_forward says.

A table per gateway (`inet sealgate_gw_<address>`, loaded by `sealgate sandbox setup`) keeps the
gateway address itself off every interface but loopback and the sandbox links (it sits on `lo`,
and a host with the weak-host model would otherwise answer it from any network), and is a floor
under every sandbox of its range should a sandbox's own table ever be missing (the gateway, or
DNS to a link's host end, and nothing else).
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Collection

from ..errors import SandboxError
from . import dns
from .network import Link, Plan

# One limit for every query of the sandbox, whatever its sockets and ports.
_DNS_RATE = f"{dns.RATE}/second burst {dns.BURST} packets"


class FirewallError(SandboxError):
    """nft refused the rules; the sandbox must not start."""



def table_name(link: Link) -> str:
    return table_name_for(link.index)


def table_name_for(index: int) -> str:
    return f"sealgate_{index}"


def sandbox_rules(
    link: Link, proxy_ports: Collection[int], transparent_port: int | None, dns_port: int
) -> str:
    """The table for one sandbox, as `nft -f` reads it."""
    ports = ", ".join(str(p) for p in sorted({*proxy_ports, *_opt(transparent_port)}))
    dev, gw, end = f'"{link.host_if}"', link.gateway, link.host_ip
    capture = (
        f"    iifname {dev} ip daddr != {gw} meta l4proto tcp dnat ip to {gw}:{transparent_port}\n"
        if transparent_port is not None else ""
    )
    return (
        f"table inet {table_name(link)} {{\n"
        "  chain prerouting {\n"
        "    type nat hook prerouting priority dstnat - 10; policy accept;\n"
        f"    iifname {dev} ip daddr {end} udp dport 53 dnat ip to {end}:{dns_port}\n"
        f"{capture}"
        "  }\n"
        "  chain input {\n"
        "    type filter hook input priority filter - 10; policy accept;\n"
        f"    iifname {dev} meta nfproto ipv6 drop\n"
        f"    iifname {dev} ip saddr != {link.sandbox_ip} drop\n"
        # Before conntrack's verdict: a query on a socket that keeps its port is "established"
        # from its second packet on, and would pass unlimited.
        f"    iifname {dev} ip daddr {end} udp dport {dns_port} limit rate over {_DNS_RATE} drop\n"
        f"    iifname {dev} ip daddr {end} udp dport {dns_port} accept\n"
        f"    iifname {dev} ct state established,related accept\n"
        f"    iifname {dev} ip daddr {gw} tcp dport {{ {ports} }} ct state new accept\n"
        # Refused at once rather than left to time out: clients fail fast and say why.
        f"    iifname {dev} meta l4proto tcp reject with tcp reset\n"
        f"    iifname {dev} drop\n"
        "  }\n"
        "  chain forward {\n"
        "    type filter hook forward priority filter - 10; policy accept;\n"
        f"    iifname {dev} drop\n"
        f"    oifname {dev} drop\n"
        "  }\n"
        "}\n"
    )


def shared_table(plan: Plan) -> str:
    return "sealgate_gw_" + str(plan.gateway).replace(".", "_")


def shared_rules(plan: Plan) -> str:
    """The gateway's guard, and a floor under every sandbox of the range should a sandbox's own
    table ever be missing: TCP to the gateway, DNS to a link's host end, nothing else, nothing
    forwarded. Scoped by the range's source addresses, so gateways of other ranges on the same
    host are not affected."""
    gw, net, links = plan.gateway, plan.range, '"sgh*"'
    return (
        f"table inet {shared_table(plan)} {{\n"
        "  chain input {\n"
        "    type filter hook input priority filter - 10; policy accept;\n"
        f'    ip daddr {gw} iifname != "lo" iifname != {links} drop\n'
        # Only sandboxes come from the range, and never over loopback.
        f'    iifname "lo" ip saddr {net} ip saddr != {gw} drop\n'
        f"    iifname {links} meta nfproto ipv6 drop\n"
        f"    iifname {links} ip saddr {net} ip daddr != {net} drop\n"
        f"    iifname {links} ip saddr {net} ip daddr {gw} meta l4proto != tcp drop\n"
        f"    iifname {links} ip saddr {net} ip daddr != {gw} meta l4proto != udp drop\n"
        # DNS only; the sandbox's table has moved it to its name server's port by now.
        f"    iifname {links} ip saddr {net} ip daddr != {gw} meta l4proto udp "
        "ct original proto-dst != 53 drop\n"
        "  }\n"
        "  chain forward {\n"
        "    type filter hook forward priority filter - 10; policy accept;\n"
        f"    iifname {links} drop\n"
        f"    oifname {links} drop\n"
        "  }\n"
        "}\n"
    )


def _opt(port: int | None) -> tuple[int, ...]:
    return () if port is None else (port,)


def load(rules: str, replace: str | None = None) -> None:
    """Load `rules` in one transaction, first deleting table `replace` if it exists."""
    if replace is not None:
        # Usually there is nothing to replace: `create` refuses a table that exists, so one
        # transaction loads the rules into a new table without deleting anything (a deletion
        # waits out the kernel's grace period, ~10-20 ms).
        if _nft(["-f", "-"], f"create table inet {replace}\n{rules}").returncode == 0:
            return
        # `add` then `delete` empties an existing table and tolerates a missing one.
        done = _nft(["-f", "-"], f"add table inet {replace}\ndelete table inet {replace}\n"
                                 f"{rules}")
    else:
        done = _nft(["-f", "-"], rules)
    if done.returncode != 0:
        raise FirewallError(f"nft: {done.stderr.strip() or done.returncode}")


def exists(table: str) -> bool:
    return _nft(["list", "table", "inet", table]).returncode == 0


def remove(table: str) -> None:
    with contextlib.suppress(FirewallError):
        _nft(["delete", "table", "inet", table])


def _nft(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["nft", *args], input=stdin, capture_output=True, text=True,
                              timeout=20, check=False)
    except subprocess.TimeoutExpired:
        raise FirewallError("nft did not answer within 20 s") from None
