"""What every sandbox holds on the host whatever its tier, and what is left when one dies.

Both ways of running a sandbox use it: a one-shot run (`sandbox.oneshot`) and sandboxd's slots
(`sandbox.daemon.slot`). It sits above the host's parts (`sandbox.host`) and the tiers, since
cleaning up after a dead run asks every tier (`clean_up_after`):

- `prerequisites`: the seccomp filter and the proxy's CA, before anything is made: on a
  machine without a filter, or with the wrong state directory, nothing is;
- `take_link`: a link (namespace and veth), its firewall table and name server, taken under
  the links' lock after cleaning up whatever dead runs left, and leased (`sandbox.host.lease`)
  before any of it exists; the namespace is removed before its table, the lease last;
- `register`: the proxy learns the sandbox's address through its control API, which is how it
  knows whose requests these are (no proxy password needs to be inside the sandbox);
- `trust`: the CA bundle (system roots plus the proxy's CA) the sandbox is handed in memory;
- `image_of`, `image_root` and `image_variables`: a sandbox's root and environment from an image
  (`sandbox.host.rootfs`), the same for a run and a slot;
- `setup` and `teardown`: what every sandbox of a range shares, once per host (the gateway).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TypeVar

from sealgate.proxy import (
    ControlError,
    SourceRefused,
    ca_bundle_path,
    control_socket,
    register_source,
    unregister_source,
)

from . import tiers
from .errors import SandboxError
from .host import firewall, lease, network, rootfs, scratch, seccomp
from .host.cgroup import Group
from .host.dns import FakeDns, LoopDns
from .host.network import Link, Plan
from .images import Image, Store
from .images import disk as images_disk
from .images import user as images_user

SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
_N = TypeVar("_N", FakeDns, LoopDns)


def setup(plan: Plan) -> None:
    """What every sandbox shares, once per host: the gateway address and its guard table.
    The proxy's listeners on the gateway need this before they can bind."""
    network.ensure_gateway(plan)
    firewall.load(firewall.shared_rules(plan), replace=firewall.shared_table(plan))


def teardown(plan: Plan) -> None:
    firewall.remove(firewall.shared_table(plan))
    network.remove_gateway(plan)


def prerequisites(state: Path) -> tuple[bytes, Path]:
    """The seccomp filter and the proxy's CA, before anything is created: on a machine without
    a filter, or with the wrong state directory, nothing is."""
    program = seccomp.program()  # SeccompUnsupported, a SandboxError, on another machine
    proxy_ca = ca_bundle_path(state)
    if not proxy_ca.is_file():
        raise SandboxError(f"no proxy CA at {proxy_ca}: is the proxy's state directory right?")
    return program, proxy_ca


def take_link(
    plan: Plan, state: Path, proxy_port: int, transparent_port: int | None, *,
    names_kind: type[_N], undo: contextlib.ExitStack, mcp_port: int | None = None,
) -> tuple[Link, _N]:
    """A link, its name server and its firewall table, taken under the links' lock (after
    cleaning up whatever runs that died left) and leased to this process; `undo` removes
    them. `mcp_port`: the gateway's MCP endpoint (`sealgate mcp serve`), let through as the
    proxy's ports are."""
    if not firewall.exists(firewall.shared_table(plan)):
        raise SandboxError("the sandbox gateway is not set up: run 'sealgate sandbox setup'")
    with network.lock():
        for left in lease.stale():
            clean_up_after(left)
        link = network.free(plan)
        table = firewall.table_name(link)
        # Leased before any of it exists: a run killed at whatever instant after this
        # leaves a stale lease, so the next run cleans up what it had built (a namespace
        # built first was lost for good, and its index with it, when the kill came between).
        lease.take(link.index, state, str(link.sandbox_ip))
        undo.callback(remove_link, link.index, table)
        network.build(link)
        try:
            names = names_kind(link.host_ip, link.host_ip)
        except OSError as exc:
            raise SandboxError(f"cannot start the sandbox's name server: {exc}") from None
        undo.callback(names.close)
        ports = [proxy_port] if mcp_port is None else [proxy_port, mcp_port]
        rules = firewall.sandbox_rules(link, ports, transparent_port, names.port)
        firewall.load(rules, replace=table)
    return link, names


def clean_up_stale() -> list[lease.Lease]:
    """Clean up after every run or daemon that died holding links; the leases it found."""
    with network.lock():
        found = lease.stale()
        for left in found:
            clean_up_after(left)
    return found


def remove_link(index: int, table: str) -> None:
    # The namespace first, then its table: nothing is ever left in it unfiltered. The lease
    # goes last, once nothing of the run is left: until then the index is not free
    # (`network._exists`), so no lock is needed here.
    try:
        network.destroy(index)
    finally:
        firewall.remove(table)
    lease.release(index)


def clean_up_after(left: lease.Lease) -> None:
    """Everything a run that died without its teardown left: its cgroups (and any process in
    them), its registration with the proxy, its link, namespace and table."""
    Group.left_by(left.groups).remove()
    tiers.clean_up(left.index)
    scratch.remove(left.index)
    if left.state:
        unregister(Path(left.state), left.address)
    remove_link(left.index, firewall.table_name_for(left.index))


def register(sandbox: str, state: Path, link: Link, undo: contextlib.ExitStack) -> None:
    """The sandbox's address, registered with the proxy as `sandbox`'s for as long as `undo`
    holds."""
    try:
        register_source(control_socket(state), link.sandbox_ip, sandbox)
    except SourceRefused as exc:
        raise SandboxError(f"the proxy refused sandbox {sandbox!r}: {exc.reason}: "
                           f"{exc.detail}") from None
    except ControlError as exc:
        raise SandboxError(f"{exc}: is the proxy running with --state {state}?") from None
    undo.callback(unregister, state, str(link.sandbox_ip))


def unregister(state: Path, address: str) -> None:
    with contextlib.suppress(ControlError):
        unregister_source(control_socket(state), address)


def trust(proxy_ca: Path) -> tuple[bytes, bytes]:
    """System roots plus the proxy's CA, and the CA alone: copies for the sandbox (the proxy's
    state directory is closed to it)."""
    ca = proxy_ca.read_bytes()
    roots = SYSTEM_BUNDLE.read_bytes() if SYSTEM_BUNDLE.is_file() else b""
    return roots.rstrip(b"\n") + b"\n" + ca, ca




# The directories an image sandbox needs in its root, whatever the image has there, by mode.
IMAGE_DIRS = {"/proc": 0o755, "/dev": 0o755, "/run": 0o755, "/workspace": 0o755,
              "/home/sandbox": 0o755, "/tmp": 0o1777, "/var/tmp": 0o1777}  # noqa: S108
# What an image's Env may set over ours: the rest (the proxy, the trust store) stays ours.
_IMAGE_MAY_SET = frozenset({"PATH", "LANG", "TERM", "HOME"})


def image_of(store: Store, name: str) -> tuple[Image, rootfs.ImageRoot]:
    """Image `name` (or digest) of the store, and what a sandbox's root needs of it. Raises
    ImageError (no such image) or OSError (the store unreadable)."""
    image = store.get(name)
    layers = tuple(store.layer_dirs(image))
    user = images_user.resolve(image.user, layers)
    return image, rootfs.ImageRoot(",".join(image.layers), layers, image.env, image.workdir,
                                   store.root / "disks",
                                   None if user is None else (user.uid, user.gid),
                                   "" if user is None else user.home)


def image_root(tier: tiers.Tier, image: rootfs.ImageRoot, index: int, uid: int,
               files: Iterable[str]) -> tuple[Path | None, Path | None, dict[str, int]]:
    """The image as the root of the sandbox on link `index`, whose scratch tmpfs is made:
    the overlay to give the tier as / (bubblewrap, gVisor), or the read-only disk its guest
    makes the root of (a microVM), and the directories that root needs, by mode. `files` are
    the staged files the tier lays over the root. Raises SandboxError (what was mounted goes
    with the tmpfs)."""
    if tier.image_owner is None:
        raise SandboxError(f"images do not run on the {tier.name} tier yet")
    dirs = dict(IMAGE_DIRS)
    if image.workdir.startswith("/") and image.workdir != "/":
        dirs.setdefault(image.workdir, 0o755)  # made if missing, as Docker does
    if tier.image_owner == "guest":
        # A kernel of its own makes the root inside, of the image as one read-only disk:
        # nothing is mounted here. Its User's home is made there, the User's.
        if image.user is not None and image.home.startswith("/") and image.home != "/":
            dirs.setdefault(image.home, 0o755)
        if image.disks is None:
            raise SandboxError("no place for the image's disk (the image store's)")
        return None, images_disk.build(image.disks, image.key, image.layers), dirs
    if image.user is not None and image.user[0] == uid and tier.image_owner != "sandbox":
        # The tier's agent has the sandbox's host uid there, and the workload must not.
        raise SandboxError(f"the image's User is uid {uid}, the sandbox's own agent's here")
    owner = (uid, uid) if tier.image_owner == "sandbox" else image.user or (0, 0)
    root = rootfs.mount(scratch.mount_point(index), owner, image.layers)
    rootfs.lay_over(root, owner, dirs, [p for p in files if not p.startswith(("/proc/", "/run/"))])
    return root, None, dirs


def image_variables(ours: Mapping[str, str], image: rootfs.ImageRoot) -> dict[str, str]:
    """The image's `Env` a command of its sandbox gets: what does not change ours, and its
    PATH, LANG, TERM and HOME. The proxy's and the trust store's variables stay ours."""
    found = {}
    for item in image.env:
        name, _, value = item.partition("=")
        if name and "\0" not in item and (name not in ours or name in _IMAGE_MAY_SET):
            found[name] = value
    if image.home and "HOME" not in found:  # its User's, as Docker gives it
        found["HOME"] = image.home
    return found
