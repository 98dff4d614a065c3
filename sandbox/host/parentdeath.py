"""A launched program dies with the process that launched it, however early that one dies.

`setpriv --pdeathsig KILL` arms the parent-death signal (after any change of uid, which disarms
it), but a parent already dead when it is armed never sends it: the launch would go on,
orphaned. So right after the signal is armed, in the same process, a shell compares its parent
with the launcher's pid and goes no further if they differ: either the launcher was alive once
the signal was armed (and its death will deliver it), or the launch stops there. What the
launched program starts in turn is its own affair (bubblewrap's sandbox: `watchdog`).
"""

from __future__ import annotations

import os
import shutil

from ..errors import SandboxError

_SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# $PPID is read once, when the shell starts: after setpriv armed the signal and exec'd it.
_STILL_OURS = '[ "$PPID" = "$1" ] || exit 125; shift; exec "$@"'


def armed(*setpriv_options: str) -> list[str]:
    """The head of a command line whose program (what follows) is killed when the calling
    process dies; `setpriv_options` (a uid, groups, capabilities) are applied before the
    signal is armed. The command is started by this process, not by one it forks first."""
    return [_system("setpriv", "util-linux"), *setpriv_options, "--pdeathsig=KILL", "--",
            _system("sh", "dash"), "-c", _STILL_OURS, "sh", str(os.getpid())]


def _system(name: str, package: str) -> str:
    found = shutil.which(name, path=_SYSTEM_PATH)
    if found is None:
        raise SandboxError(f"{name} is not installed (Debian package {package})")
    return found
