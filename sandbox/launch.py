"""The command line that starts a sandboxed process: bubblewrap, inside the sandbox's network
namespace, as an unprivileged user.

- `ip netns exec` puts it in the sandbox's namespace; `setpriv` then drops to an unprivileged
  uid before bubblewrap runs, so the process is never root outside (a root-owned 0600 file
  stays unreadable even through a read-only bind);
- bubblewrap gives it new user, PID, IPC, UTS and cgroup namespaces (the network one stays the
  sandbox's), no capabilities, no nested user namespaces, a new session (no keystrokes pushed
  into the caller's terminal), and dies with its parent;
- the filesystem is the host's system directories read-only (/usr, /etc and the /bin, /sbin,
  /lib links), fresh /proc, /dev and empty tmpfs on /tmp, /run and the home directory, and
  the workspace, if given, read-write at /workspace. Nothing else of the host is visible: not
  the proxy's state, not other users' files, not /run's sockets;
- what the sandbox reads in place of host files (`staged`: the CA bundle, its resolv.conf, a
  neutral host name, an empty /proc/cmdline) is handed to bubblewrap by content, through file
  descriptors, and so are bubblewrap's own arguments: no host path of the run shows in the
  sandbox's mount table, nor on the command line of its PID 1 (bubblewrap), which it can read;
- the environment is built from nothing (`environment`, handed to the process, never on a
  command line where `ps` would show it): PATH, HOME, LANG, the proxy for HTTP(S), and the
  trust-store variables that make common clients trust the proxy's CA;
- the seccomp filter of `sandbox.seccomp` is installed last, just before the command runs.
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
from sealgate.sandbox.network import Link

NOBODY = 65534
WORKSPACE = "/workspace"
HOME = "/home/sandbox"
BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # where Debian-style clients look
PROXY_CA = "/run/sealgate/proxy-ca.pem"
HOSTNAME = "sandbox"
_HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_SYSTEM_DIRS = ("/usr", "/etc")
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")



@dataclass(frozen=True)
class Launch:
    link: Link
    command: Sequence[str]
    proxy_port: int
    files: Mapping[str, int]  # a path in the sandbox -> a descriptor to read its content from
    seccomp_fd: int
    workspace: Path | None = None
    uid: int = NOBODY
    gid: int = NOBODY
    env: Mapping[str, str] = field(default_factory=dict)  # extra variables, given explicitly
    # The sandbox's own writable places, by path there -> a directory of its scratch tmpfs
    # (`sandbox.scratch`); what is not given is a tmpfs of bubblewrap's (or, for /workspace,
    # `workspace` or nothing).
    writable: Mapping[str, Path] = field(default_factory=dict)


def staged(link: Link, bundle: bytes, proxy_ca: bytes) -> dict[str, bytes]:
    """What the sandbox reads in place of host files, by its path there: the trust store
    (system roots plus the proxy's CA), its own name server, and nothing about the host."""
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
                  if os.path.isfile(path) and not os.path.islink(path)})
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
    env.update(clientenv.variables(proxy, BUNDLE))
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


def argv(launch: Launch, args_fd: int, cgroups: Sequence[Path]) -> list[str]:
    """The host's command line: into the cgroups, the namespace, the uid, then bubblewrap, whose
    arguments (`bwrap_args`) are read from `args_fd`."""
    return [tool("sh"), "-c", _JOIN, "sh", *(str(c) for c in cgroups), "--",
            tool("ip"), "netns", "exec", launch.link.netns,
            tool("setpriv"), f"--reuid={launch.uid}", f"--regid={launch.gid}", "--clear-groups",
            "--", tool("bwrap"), "--args", str(args_fd), "--", *launch.command]


def bwrap_args(launch: Launch) -> list[str]:
    args = ["--unshare-all", "--unshare-user", "--share-net", "--disable-userns",
            "--hostname", HOSTNAME, "--cap-drop", "ALL", "--die-with-parent", "--new-session"]
    for path in _SYSTEM_DIRS:
        args += ["--ro-bind", path, path]
    for path in _SYSTEM_LINKS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    # The sandbox's own empty /tmp, not the host's.
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/run", "--tmpfs", "/home"]
    if "/tmp" not in launch.writable:  # noqa: S108
        args += ["--tmpfs", "/tmp"]  # noqa: S108
    if HOME not in launch.writable:
        args += ["--dir", HOME]
    for inside, host in launch.writable.items():
        args += ["--bind", str(host), inside]
    for path, fd in launch.files.items():  # over /proc and /etc, so after them
        args += ["--perms", "0444", "--ro-bind-data", str(fd), path]
    chdir = HOME
    if launch.workspace is not None:
        args += ["--bind", str(launch.workspace), WORKSPACE]
    if launch.workspace is not None or WORKSPACE in launch.writable:
        chdir = WORKSPACE
    args += ["--chdir", chdir, "--seccomp", str(launch.seccomp_fd)]
    return args
