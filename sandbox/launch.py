"""The command line that starts a sandboxed process: bubblewrap, inside the sandbox's network
namespace, as an unprivileged user.

- `ip netns exec` puts it in the sandbox's namespace; `setpriv` then drops to an unprivileged
  uid before bubblewrap runs, so the process is never root outside (a root-owned 0600 file
  stays unreadable even through a read-only bind);
- bubblewrap gives it new user, PID, IPC, UTS and cgroup namespaces (the network one stays the
  sandbox's), no capabilities, no nested user namespaces, a new session (no keystrokes pushed
  into the caller's terminal), and dies with its parent;
- the filesystem is the host's system directories read-only (/usr, /etc and the /bin, /sbin,
  /lib links; /etc/resolv.conf names the sandbox's own name server), fresh /proc, /dev and
  empty tmpfs on /tmp, /run and the home directory, and
  the workspace, if given, read-write at /workspace. Nothing else of the host is visible: not
  the proxy's state, not other users' files, not /run's sockets;
- the environment is built from nothing (`environment`, handed to the process, never on a
  command line where `ps` would show it): PATH, HOME, LANG, the proxy for HTTP(S), and the
  trust-store variables that make common clients trust the proxy's CA;
- the seccomp filter of `sandbox.seccomp` is installed last, just before the command runs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.network import Link

NOBODY = 65534
WORKSPACE = "/workspace"
HOME = "/home/sandbox"
BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # where Debian-style clients look
PROXY_CA = "/run/sealgate/proxy-ca.pem"
_HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_SYSTEM_DIRS = ("/usr", "/etc")
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Variables that point clients at a CA bundle; all get the bundle with the proxy's CA in it.
_BUNDLE_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT",
                "GIT_SSL_CAINFO", "AWS_CA_BUNDLE", "CARGO_HTTP_CAINFO", "DENO_CERT")


@dataclass(frozen=True)
class Launch:
    link: Link
    command: Sequence[str]
    proxy_port: int
    bundle: Path  # system roots plus the proxy's CA, on the host
    proxy_ca: Path
    resolv_conf: Path  # names the sandbox's own name server
    seccomp_fd: int
    workspace: Path | None = None
    uid: int = NOBODY
    gid: int = NOBODY
    env: Mapping[str, str] = field(default_factory=dict)  # extra variables, given explicitly


def environment(launch: Launch) -> dict[str, str]:
    proxy = f"http://{launch.link.gateway}:{launch.proxy_port}"
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": HOME,
        "LANG": "C.UTF-8",
        "TERM": os.environ.get("TERM", "dumb"),
        "SEALGATE_SANDBOX": "1",
        "NODE_EXTRA_CA_CERTS": PROXY_CA,
    }
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        env[name] = proxy
    env["no_proxy"] = env["NO_PROXY"] = "localhost,127.0.0.1"
    env.update(dict.fromkeys(_BUNDLE_VARS, BUNDLE))
    env.update(launch.env)
    return env


def tool(name: str) -> str:
    """A host program the launch runs as root, found in the system directories only: never
    through a PATH the sandbox's environment (which these programs inherit) could set."""
    found = shutil.which(name, path=_HOST_PATH)
    if found is None:
        raise FileNotFoundError(f"{name} not found in {_HOST_PATH}")
    return found


def argv(launch: Launch) -> list[str]:
    args = [tool("ip"), "netns", "exec", launch.link.netns,
            tool("setpriv"), f"--reuid={launch.uid}", f"--regid={launch.gid}", "--clear-groups",
            "--", tool("bwrap"),
            "--unshare-all", "--unshare-user", "--share-net", "--disable-userns",
            "--cap-drop", "ALL",
            "--die-with-parent", "--new-session"]
    for path in _SYSTEM_DIRS:
        args += ["--ro-bind", path, path]
    for path in _SYSTEM_LINKS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    # The sandbox's own empty /tmp, not the host's.
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run",  # noqa: S108
             "--tmpfs", "/home", "--dir", HOME,
             "--ro-bind", str(launch.bundle), BUNDLE, "--ro-bind", str(launch.proxy_ca), PROXY_CA,
             "--ro-bind", str(launch.resolv_conf), "/etc/resolv.conf"]
    chdir = HOME
    if launch.workspace is not None:
        args += ["--bind", str(launch.workspace), WORKSPACE]
        chdir = WORKSPACE
    args += ["--chdir", chdir, "--seccomp", str(launch.seccomp_fd), "--", *launch.command]
    return args
