"""What every isolation tier starts a sandbox from (`sandbox.tiers`): the `Launch`, the files the
sandbox reads in place of the host's, its environment, and the head of the host command line
that puts the first process in the run's cgroups and the sandbox's network namespace.

- `ip netns exec` puts it in the sandbox's namespace, after the cgroups are joined, so nothing
  of the sandbox ever runs outside either; the tier's own program follows (bubblewrap under
  `setpriv`, runsc, ...);
- what the sandbox reads in place of host files (`staged`: the CA bundle, its resolv.conf, a
  neutral host name, an empty /proc/cmdline) is given by content: each tier hands it over
  without a host path of the run's showing in the sandbox;
- the environment is built from nothing (`environment`, handed to the process, never on a
  command line where `ps` would show it): PATH, HOME, LANG, the proxy for HTTP(S), and the
  trust-store variables that make common clients trust the proxy's CA.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sealgate import clientenv
from sealgate.hostport import format_hostport

from . import parentdeath
from .cgroup import Limits
from .network import Link

NOBODY = 65534
WORKSPACE = "/workspace"
HOME = "/home/sandbox"
BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # where Debian-style clients look
PROXY_CA = "/run/sealgate/proxy-ca.pem"
HOSTNAME = "sandbox"
_HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
SYSTEM_DIRS = ("/usr", "/etc")
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")



@dataclass(frozen=True)
class Launch:
    link: Link
    command: Sequence[str]
    proxy_port: int
    files: Mapping[str, bytes]  # a path in the sandbox -> what it reads there (`staged`)
    seccomp: bytes  # the filter program of `sandbox.host.seccomp`, for tiers that install one
    workspace: Path | None = None
    uid: int = NOBODY
    gid: int = NOBODY
    env: Mapping[str, str] = field(default_factory=dict)  # extra variables, given explicitly
    # The sandbox's own writable places, by path there -> a directory of its scratch tmpfs
    # (`sandbox.host.scratch`); what is not given is a tmpfs of bubblewrap's (or, for /workspace,
    # `workspace` or nothing).
    writable: Mapping[str, Path] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)  # the workload's (`Tier.host_limits`)
    # The command is sandboxd's agent (`sandbox.guest.agent`), not the workload: it gives each
    # command PID and mount namespaces of its own, for which it holds CAP_SYS_ADMIN in the
    # sandbox's user namespace, and installs `seccomp` on each command itself (it could not
    # make namespaces under the filter).
    agent: bool = False
    # The sandbox's own root from an image (`sandbox.host.rootfs`), in place of the host's
    # system directories: the sandbox is root of its user namespace there (its uid outside).
    root: Path | None = None
    # Over an image whose `User` names one: the ids the sandbox has inside (`ImageRoot.user`),
    # its one host uid's names there, its commands' as well as its root's owner.
    image_user: tuple[int, int] | None = None
    # And its home (`ImageRoot.home`), made the User's by a tier that makes the root inside.
    image_home: str = ""
    # Or, for a tier with a kernel of its own (`Tier.image_owner == "guest"`), the image as one
    # read-only disk (`sandbox.images.disk`) and the directories to make in the root its guest
    # makes of it, by mode.
    disk: Path | None = None
    root_dirs: Mapping[str, int] = field(default_factory=dict)
    cwd: str | None = None  # where the command starts (an image's WorkingDir); None: `working_dir`
    # The command's time limit in seconds, for a tier that keeps it itself from the command's
    # start (`Tier.own_clock`); None: none, or the runtime's own bound alone keeps it.
    timeout: float | None = None
    # The gateway's MCP endpoint (`sealgate mcp serve` there), told as SEALGATE_MCP_URL.
    mcp_port: int | None = None
    # A saved VM's memory to resume as a copy of it instead of booting (`Tier.no_fork` None).
    resume: Path | None = None


def working_dir(launch: Launch) -> str:
    """Where the command starts: the launch's own, else /workspace if it has one, else home."""
    if launch.cwd is not None:
        return launch.cwd
    return WORKSPACE if launch.workspace is not None or WORKSPACE in launch.writable else HOME


def staged(link: Link, bundle: bytes, proxy_ca: bytes, image: bool = False) -> dict[str, bytes]:
    """What the sandbox reads in place of host files, by its path there: the trust store
    (system roots plus the proxy's CA), its own name server, and nothing about the host. Over
    an image's root (`image`), all of them, whatever the image has there."""
    files = {
        BUNDLE: bundle,
        PROXY_CA: proxy_ca,
        "/etc/resolv.conf": f"nameserver {link.host_ip}\noptions timeout:2 attempts:2\n".encode(),
        "/proc/cmdline": b"",  # the host's boot line: its kernel, devices, sometimes secrets
    }
    neutral = {
        "/etc/hostname": f"{HOSTNAME}\n",
        "/etc/mailname": f"{HOSTNAME}\n",
        "/etc/hosts": f"127.0.0.1\tlocalhost\n127.0.1.1\t{HOSTNAME}\n",
        "/etc/machine-id": secrets.token_hex(16) + "\n",  # a host's lasting identity otherwise
    }
    # Only over files the host has (a new mount point would have to be made in its /etc), and
    # never through a link, which could lead the mount anywhere.
    files.update({path: text.encode() for path, text in neutral.items()
                  if image or (os.path.isfile(path) and not os.path.islink(path))})
    return files


def environment(launch: Launch) -> dict[str, str]:
    proxy = f"http://{format_hostport(str(launch.link.gateway), launch.proxy_port)}"
    env = {
        "PATH": f"{HOME}/.local/bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": HOME,
        "LANG": "C.UTF-8",
        "TERM": os.environ.get("TERM", "dumb"),
        "SEALGATE_SANDBOX": "1",
        # The system is read-only and everything writable is thrown away with the sandbox:
        # installers go to the home directory (pip's user site, npm's prefix), and pip need not
        # guard a system it cannot change from an install that does not outlive the sandbox.
        "PIP_BREAK_SYSTEM_PACKAGES": "1",
        "NPM_CONFIG_PREFIX": f"{HOME}/.local",
    }
    mcp = (None if launch.mcp_port is None else
           f"http://{format_hostport(str(launch.link.gateway), launch.mcp_port)}/mcp")
    env.update(clientenv.variables(proxy, BUNDLE, mcp))
    env.update(launch.env)
    return env


def tool(name: str) -> str:
    """A host program the launch runs as root, found in the system directories only: never
    through a PATH the sandbox's environment (which these programs inherit) could set."""
    found = shutil.which(name, path=_HOST_PATH)
    if found is None:
        raise FileNotFoundError(f"{name} not found in {_HOST_PATH}")
    return found


# Joins each cgroup named before "--", then runs what follows: the first process is in its
# groups before anything of the sandbox runs (no preexec_fn, unsafe in a threaded daemon).
_JOIN = 'for d do [ "$d" = -- ] && break; echo 0 > "$d/cgroup.procs" || exit 125; shift; done; ' \
    'shift; exec "$@"'


def host_prefix(launch: Launch, cgroups: Sequence[Path]) -> list[str]:
    """The head of every tier's host command line: dying with the runtime, into the cgroups,
    then the namespace; the tier's program follows, still root (a tier that changes the uid
    arms the parent-death signal again after it: `parentdeath`)."""
    return [*parentdeath.armed(), tool("sh"), "-c", _JOIN, "sh", *(str(c) for c in cgroups), "--",
            tool("ip"), "netns", "exec", launch.link.netns]
