"""What the guest agent (`guestagent`) asks of the guest's system: its network, its files,
its channel's device, its processes. Standard library only, as the agent."""

from __future__ import annotations

import contextlib
import os
import subprocess

PORT_NAME = "sealgate.agent"


def killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def configure(address: str, gateway: str) -> None:
    for argv in (["ip", "addr", "add", address, "dev", "eth0"], ["ip", "link", "set", "eth0", "up"],
                 ["ip", "route", "add", "default", "via", gateway]):
        done = subprocess.run(["/sealgate/busybox", *argv], capture_output=True, check=False)
        if done.returncode != 0:
            raise OSError(f"{' '.join(argv)}: {done.stderr.decode(errors='replace').strip()}")


def put(path: str, data: bytes, mode: int, uid: int, gid: int) -> None:
    os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
    tmp = f"{path}.sealgate-tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, data)
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def port_path() -> str:
    """The device of the agent's channel (a virtio console port found by its name)."""
    base = "/sys/class/virtio-ports"
    for name in sorted(os.listdir(base)):
        try:
            with open(f"{base}/{name}/name") as fh:
                if fh.read().strip() == PORT_NAME:
                    return f"/dev/{name}"
        except FileNotFoundError:  # a console port has no name
            continue
    raise FileNotFoundError(f"no virtio port named {PORT_NAME}")
