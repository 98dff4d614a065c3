"""`sealgate sandbox setup | run | teardown | gc` (the runtime around the proxy, root only) and
the daemon's thin client: `create | exec | shell | put | get | ls | rm` (`sandbox.clients`).

Only argparse at import: what a command runs is imported when it runs, so `sealgate --help` and
the client commands start in tens of milliseconds."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import TYPE_CHECKING

from sealgate.clikit import Subcommands

from . import tiers
from .clients import filescli, sessioncli, shellcli
from .errors import SandboxError
from .host.cgroup import CgroupError, Limits, parse_size
from .host.network import DEFAULT_GATEWAY, DEFAULT_RANGE, NetworkError, Plan

if TYPE_CHECKING:
    from .host.rootfs import ImageRoot


def register(sub: Subcommands) -> None:
    p = sub.add_parser("sandbox", help="run commands whose only way out is the proxy (root), "
                                       "and drive sandboxd")
    ps = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    def plan_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--range", type=IPv4Network, default=DEFAULT_RANGE,
                            help=f"addresses for sandbox links (default {DEFAULT_RANGE})")
        parser.add_argument("--gateway", type=IPv4Address, default=DEFAULT_GATEWAY,
                            help=f"the proxy's address for sandboxes (default {DEFAULT_GATEWAY})")

    s = ps.add_parser("setup", help="put the gateway address in place (before the proxy binds "
                                    "it) and guard it")
    plan_args(s)
    s.set_defaults(func=_setup)
    t = ps.add_parser("teardown", help="remove the gateway address and its guard")
    plan_args(t)
    t.set_defaults(func=_teardown)

    r = ps.add_parser("run", help="run a command in a new sandbox")
    plan_args(r)
    r.add_argument("--sandbox", required=True, help="the sandbox id the rules name")
    r.add_argument("--state", type=Path, default=Path(os.environ.get("SEALGATE_STATE", "var")),
                   help="the proxy's state directory (control socket, CA)")
    r.add_argument("--proxy-port", type=int, default=3128,
                   help="the proxy's explicit listener on the gateway (default 3128)")
    r.add_argument("--transparent-port", type=int, default=None,
                   help="the proxy's transparent listener on the gateway: other TCP goes there")
    r.add_argument("--mcp-port", type=int, default=None,
                   help="`sealgate mcp serve` on the gateway at this port: let through, and "
                        "told to the command as SEALGATE_MCP_URL")
    r.add_argument("--workspace", type=Path, help="a directory mounted read-write at /workspace")
    r.add_argument("--uid", type=int, default=65534, help="user id to run as (default nobody)")
    r.add_argument("--isolation", choices=tiers.NAMES, default=tiers.DEFAULT,
                   help="what confines the command: bwrap (namespaces on the host's kernel), "
                        "gvisor (gVisor's user-space kernel), microvm (a KVM guest) "
                        f"(default {tiers.DEFAULT})")
    r.add_argument("--pids", type=int, default=Limits.pids,
                   help=f"most processes and threads at once (default {Limits.pids})")
    r.add_argument("--memory", default="4G",
                   help="most memory, swap included: 512M, 4G, ... (default 4G)")
    r.add_argument("--cpus", type=float, default=Limits.cpus,
                   help=f"CPU time in cores, 0 for no quota (default {Limits.cpus})")
    r.add_argument("--timeout", type=parse_duration, default="10m", metavar="DURATION",
                   help="wall-clock time the command may run, then it and everything it started "
                        "are killed and the exit status is 124: 30s, 10m, 2h, seconds; 0 for "
                        "none (default 10m)")
    r.add_argument("--env", action="append", default=[], metavar="NAME[=VALUE]",
                   help="an extra environment variable (repeatable): NAME passes the caller's "
                        "value (never shown by ps), NAME=VALUE sets one (visible to ps: not for "
                        "secrets); nothing else of the caller's environment is passed")
    r.add_argument("--image", help="the sandbox's root: an image of the store (sealgate image), "
                                   "its layers read-only under the run's own writes; without a "
                                   "COMMAND its Entrypoint and Cmd run")
    r.add_argument("--images", type=Path,
                   help="the image store (default: STATE/images)")
    r.add_argument("--disk", default="1G",
                   help="with --image: most bytes the run writes over it (default 1G)")
    r.add_argument("command", nargs="*", metavar="-- COMMAND")
    r.set_defaults(func=_run)
    g = ps.add_parser("gc", help="clean up what runs and daemons that died left (their leases: "
                                 "processes, registrations, links, tables, cgroups, tmpfs)")
    g.set_defaults(func=_gc)
    a = ps.add_parser("pod-agent", help="write the agent a Kubernetes sandbox runs (one file for "
                                        "python3, for sandboxd --backend kubernetes)")
    a.add_argument("path", type=Path, help="where to write it (e.g. /opt/sealgate/agent.pyz)")
    a.set_defaults(func=_pod_agent)
    sessioncli.register(ps)
    filescli.register(ps)
    shellcli.register(ps)


def parse_duration(text: str) -> float | None:
    """`30s`, `10m`, `2h`, `1.5` (seconds): seconds; `0` for no limit (None)."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([smh]?)", text.strip(), re.ASCII)
    seconds = float(found[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[found[2]] if found else -1
    if not 0 <= seconds < math.inf:
        raise argparse.ArgumentTypeError(f"not a duration: {text[:32]!r} (write 30s, 10m, 2h or "
                                         "seconds; 0 for none)")
    return seconds or None


def _root() -> str | None:
    return None if os.geteuid() == 0 else "sealgate sandbox needs root (network namespaces, " \
        "nftables)"


def _plan(args: argparse.Namespace) -> Plan:
    return Plan(range=args.range, gateway=args.gateway)


def _setup(args: argparse.Namespace) -> int:
    from .runtime import setup

    return _guarded(lambda: setup(_plan(args)))


def _teardown(args: argparse.Namespace) -> int:
    from .runtime import teardown

    return _guarded(lambda: teardown(_plan(args)))


def _pod_agent(args: argparse.Namespace) -> int:
    from .guest.staging import pod_agent

    try:
        args.path.parent.mkdir(parents=True, exist_ok=True)
        args.path.write_bytes(pod_agent())
        args.path.chmod(0o644)
    except OSError as exc:
        print(f"sealgate sandbox pod-agent: {args.path}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


def _gc(_: argparse.Namespace) -> int:
    from .runtime import clean_up_stale

    def clean() -> None:
        for left in clean_up_stale():
            print(f"cleaned up after process {left.pid} (link {left.index}, "
                  f"{left.address or 'no address'})")

    return _guarded(clean)


def _guarded(action: Callable[[], None]) -> int:
    if problem := _root():
        print(problem, file=sys.stderr)
        return 2
    try:
        action()
    except RuntimeError as exc:  # SandboxError (NetworkError, FirewallError, ...)
        print(f"sealgate: {exc}", file=sys.stderr)
        return 1
    return 0


def _run(args: argparse.Namespace) -> int:
    from .oneshot import Run, run

    if problem := _root():
        print(problem, file=sys.stderr)
        return 2
    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep:
            value = os.environ.get(name, "")
        # The launch's own root programs inherit this environment: no loader variables.
        if not name or name.startswith("LD_") or name == "PATH":
            print(f"sealgate: --env {name[:40]!r} is not allowed", file=sys.stderr)
            return 2
        env[name] = value
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if problem := tiers.available(args.isolation):
        print(f"sealgate: isolation {args.isolation} is not available: {problem}",
              file=sys.stderr)
        return 2
    try:
        limits = Limits(args.pids, parse_size(args.memory), args.cpus or None)
        disk = parse_size(args.disk)
        plan = _plan(args)
    except (CgroupError, NetworkError) as exc:
        print(f"sealgate: {exc}", file=sys.stderr)
        return 2
    image = None
    if args.image is not None:
        try:
            image, command = _image(args, command)
        except SandboxError as exc:  # ImageError
            print(f"sealgate: {exc}", file=sys.stderr)
            return 2
    if not command:
        print("sealgate: no command to run (give one after --, or an image with an Entrypoint "
              "or Cmd)", file=sys.stderr)
        return 2
    spec = Run(
        sandbox=args.sandbox, command=command, state=args.state, proxy_port=args.proxy_port,
        transparent_port=args.transparent_port, mcp_port=args.mcp_port, plan=plan,
        workspace=args.workspace,
        uid=args.uid, gid=args.uid, env=env, limits=limits, timeout=args.timeout,
        isolation=args.isolation, image=image, disk=disk,
    )
    try:
        return run(spec)
    except SandboxError as exc:
        print(f"sealgate: {exc}", file=sys.stderr)
        return 125


def _image(args: argparse.Namespace, command: list[str]) -> tuple[ImageRoot, list[str]]:
    """The run's root from `--image`, and its command: the given one, else the image's
    Entrypoint and Cmd (a given command replaces the Cmd, as `docker run` does, and runs
    after the Entrypoint). Raises SandboxError (ImageError)."""
    from .images import ImageError, Store
    from .runtime import image_of

    store = Store(args.images or args.state / "images")
    try:
        image, root = image_of(store, args.image)
    except OSError as exc:
        raise ImageError(f"the image store: {exc.strerror or exc}") from None
    if image.owner is not None and image.owner != args.sandbox:
        # A snapshot or template carries what its sandbox wrote: that sandbox's alone.
        raise ImageError(f"image {args.image[:64]!r} belongs to another sandbox")
    return root, [*image.entrypoint, *(command or image.cmd)]
