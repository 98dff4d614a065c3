"""What of this package goes into a sandbox, and where. Used on the host only.

- bubblewrap and gVisor: the agent's modules as one zip (`ZIP`) and a script that runs them
  (`AGENT`, what python3 is given: a zip run directly would cost the agent's start runpy's
  imports, ~7 ms; from `sys.path` it is zipimport's, frozen); both handed over in memory;
- a Kubernetes pod: the agent's modules and `carry` as one zip Python runs (`pod_agent`,
  written by `sealgate sandbox pod-agent` into the pod, from an init container);
- the microVM: its guest agent's modules in the initramfs (`VM_MODULES`, under
  `/sealgate/guest`, `tiers/microvm/image.py`), and, for put and get as the sandbox's uid, the
  same zip, staged in the guest by its launcher (`hostserve` runs `entry("shim")`).
"""

from __future__ import annotations

import functools
import io
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = "guest"  # this package's name inside a sandbox
AGENT = "/run/sealgate/agent.py"  # where the sandbox sees the agent's script
ZIP = "/run/sealgate/guest.zip"
AGENT_MODULES = ("__init__.py", "protocol.py", "confine.py", "commands.py", "files.py",
                 "fsops.py", "tarball.py", "tarout.py", "watch.py", "portdial.py", "shim.py",
                 "terminal.py", "agent.py")
VM_MODULES = ("__init__.py", "protocol.py", "vmagent.py", "vmos.py", "vmroot.py", "layover.py",
              "terminal.py", "files.py", "fsops.py", "tarout.py")  # the last three: `layer`'s
VM_INIT = HERE / "init.sh"
PROBE = HERE / "probe.py"  # run by the self-test's canary as a script of its own


def entry(module: str) -> str:
    """Python source that runs `module`'s `main` on the script's arguments, from the zip."""
    return (f"import sys; sys.path.insert(0, {ZIP!r}); "
            f"from {PACKAGE}.{module} import main; main(sys.argv[1:])")


@functools.cache
def _zip() -> bytes:
    return _bundle(AGENT_MODULES, {})


def pod_agent() -> bytes:
    """The agent for a pod (`sandbox.kubernetes`), as one file Python runs (`python3 -I
    agent.pyz`): the agent's modules and `carry`, whose pod end serves the process's standard
    input and output and starts the agent from the same file. The pod needs a python3 (3.11 or
    later) and nothing of sealgate's installed."""
    main = "import sys\nfrom guest.carry import main\nmain(sys.argv[1:])\n"
    return _bundle((*AGENT_MODULES, "carry.py", "carrylink.py"),
                   {"__main__.py": main.encode()})


def _bundle(names: tuple[str, ...], extra: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    # Stored, not deflated (no zlib to load), with a fixed date: the same modules make the
    # same bytes.
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as bundle:
        files = {**{f"{PACKAGE}/{name}": (HERE / name).read_bytes() for name in names}, **extra}
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            bundle.writestr(info, data)
    return out.getvalue()


def agent_files() -> dict[str, bytes]:
    """The agent's files, by their path in the sandbox."""
    return {AGENT: entry("agent").encode() + b"\n", ZIP: _zip()}
