"""`sealgate sandboxd`: the sandbox daemon, serving its API until SIGTERM or SIGINT (root).

The heavy imports (aiohttp, the daemon) happen only when it runs, so registering the command
costs the rest of the CLI nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

from sealgate import oplog
from sealgate.clikit import Subcommands, env_option

from .. import tiers
from ..host.network import DEFAULT_GATEWAY, DEFAULT_RANGE

DEFAULT_SOCKET = Path("/run/sealgate/sandboxd.sock")


def register(sub: Subcommands) -> None:
    p = sub.add_parser("sandboxd", help="the sandbox daemon: long-lived sandboxes over an API, "
                                        "from a warm pool (root)")
    env = os.environ.get
    p.add_argument("--state", type=Path, default=Path(env("SEALGATE_STATE", "var")),
                   help="the proxy's state directory (control socket, CA)")
    p.add_argument("--proxy-port", type=int, default=3128,
                   help="the proxy's explicit listener on the gateway (default 3128)")
    p.add_argument("--transparent-port", type=int, default=None,
                   help="the proxy's transparent listener on the gateway: other TCP goes there")
    p.add_argument("--mcp-port", type=int, default=None,
                   help="`sealgate mcp serve` on the gateway at this port (given the proxy's "
                        "--state, it knows a sandbox by its address): let through, and told to "
                        "every command as SEALGATE_MCP_URL")
    p.add_argument("--range", type=IPv4Network, default=DEFAULT_RANGE,
                   help=f"addresses for sandbox links (default {DEFAULT_RANGE})")
    p.add_argument("--gateway", type=IPv4Address, default=DEFAULT_GATEWAY,
                   help=f"the proxy's address for sandboxes (default {DEFAULT_GATEWAY})")
    p.add_argument("--socket", type=Path, default=Path(env("SEALGATE_SANDBOXD", DEFAULT_SOCKET)),
                   help=f"the API's unix socket, owner-only (default {DEFAULT_SOCKET})")
    env_option(p, "--admin", metavar="HOST:PORT", env="SEALGATE_SANDBOXD_ADMIN",
               help="serve /healthz, /readyz and /metrics over plain TCP there, nothing else "
                    "of the API (for probes and Prometheus)")
    p.add_argument("--listen", metavar="HOST:PORT",
                   help="also serve the API over TCP, every request with the bearer key")
    p.add_argument("--key-file", type=Path,
                   help="the TCP listener's bearer key (a file: never on a command line)")
    p.add_argument("--tls-cert", type=Path, help="serve the TCP listener over TLS: certificate")
    p.add_argument("--tls-key", type=Path, help="... and its private key")
    p.add_argument("--pool", action="append", metavar="[IMAGE=]N",
                   help="sandboxes kept ready: N on the host's system directories (default 4), "
                        "IMAGE=N of an image (repeatable)")
    p.add_argument("--images", type=Path,
                   help="the image store (sealgate image; default: STATE/images)")
    p.add_argument("--max-sandboxes", type=int, default=256,
                   help="most sandboxes alive at once (default 256)")
    p.add_argument("--max-ttl", type=float, default=24 * 3600.0,
                   help="the longest ttl a create may ask for, seconds (default 86400)")
    p.add_argument("--uid-base", type=int, default=3_000_000,
                   help="sandbox n runs as this uid plus n (default 3000000)")
    p.add_argument("--disk", default="1G",
                   help="each sandbox's writable layer (tmpfs, counted as its memory; "
                        "default 1G)")
    p.add_argument("--isolation", choices=tiers.NAMES, default=tiers.DEFAULT,
                   help="what confines every sandbox of this daemon: "
                        f"{', '.join(tiers.NAMES)} (default {tiers.DEFAULT})")
    p.add_argument("--no-selftest", action="store_true",
                   help="report ready without first proving the network boundary holds")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--adopt", action="store_true",
                     help="take over the live sandboxes of the daemon serving --socket (an "
                          "upgrade without losing work), or refuse to start; the default does "
                          "so when one serves there")
    how.add_argument("--no-adopt", action="store_true",
                     help="never take over: refuse to start while a daemon serves --socket")
    kube = p.add_argument_group("the Kubernetes backend (--backend kubernetes)")
    kube.add_argument("--backend", choices=("host", "kubernetes"), default="host",
                      help="where sandboxes run: on this host (namespaces, a tier; root), or "
                           "as Agent Sandbox claims on a cluster's warm pools (default host)")
    env_option(kube, "--kubeconfig", env="KUBECONFIG", metavar="FILE",
               help="the cluster's kubeconfig (default: the pod's service account)")
    kube.add_argument("--namespace", help="the claims' and pods' namespace (default sandboxes)")
    kube.add_argument("--warm-pool", action="append", metavar="SANDBOX=POOL",
                      help="the SandboxWarmPool whose pods are sandbox id SANDBOX's (its "
                           "template labels them so); repeatable")
    kube.add_argument("--container", help="the pod's container the agent runs in (default: "
                                          "its only one)")
    kube.add_argument("--instance", default="sandboxd", metavar="NAME",
                      help="this daemon's name on its claims (label sealgate.dev/sandboxd): "
                           "the claims with it that an earlier run left (killed, its node "
                           "lost) are deleted at start, so one daemon per name and namespace "
                           "(default sandboxd)")
    kube.add_argument("--ready-seconds", type=float, default=180.0,
                      help="how long a claim may take to be ready (default 180)")
    kube.add_argument("--agent", metavar="COMMAND",
                      help="the agent's command in the pod, split on spaces (default: "
                           "python3 -I /opt/sealgate/agent.pyz)")
    oplog.add_flags(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.backend == "kubernetes":
        from ..kubernetes import serve as kubernetes  # kubernetes-asyncio only when it runs

        return _started(kubernetes, args)
    if os.geteuid() != 0:
        print("sealgate sandboxd needs root (network namespaces, nftables, cgroups)",
              file=sys.stderr)
        return 2
    from . import serve  # aiohttp only when the daemon runs

    return _started(serve, args)


def _started(serve: Any, args: argparse.Namespace) -> int:
    """`serve`'s Settings from the command line, then its main (either backend's)."""
    try:
        settings = serve.Settings.of(args)
    except ValueError as exc:
        print(f"sealgate sandboxd: {exc}", file=sys.stderr)
        return 2
    # Lifecycle events on stdout, the operational log on stderr (`events`).
    oplog.configure(args.log_format, args.log_level, events=sys.stdout)
    return int(serve.main(settings))
