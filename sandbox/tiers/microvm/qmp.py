"""QEMU's machine protocol (QMP), on one end of a socket pair whose other end QEMU was handed
(`-chardev socket,fd=N -mon mode=control`): no path of the host's, nothing else can connect.

Used for a VM's memory snapshot (`save`: stopped, its state written to a descriptor handed over
with `getfd`, as `migrate fd:` does) and its resumption in another QEMU (`resumed`: started
with `-incoming fd:N`, then continued). One caller at a time (a lock); every wait is bounded.
QEMU's answers are JSON lines; events between them are skipped.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

from ...errors import SandboxError

_LINE_MAX = 1 << 20  # an answer longer than this is not QEMU's
_POLL = 0.01


class Monitor:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""
        self._lock = threading.Lock()
        self._open = False

    def execute(self, command: str, arguments: dict[str, Any] | None = None, *,
                fds: tuple[int, ...] = (), timeout: float = 30.0) -> Any:
        """`command`'s return value. Raises SandboxError for QEMU's refusal or no answer."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if not self._open:  # the greeting, then the capabilities negotiation
                self._line(deadline)
                self._call("qmp_capabilities", None, (), deadline)
                self._open = True
            return self._call(command, arguments, fds, deadline)

    def save(self, fd: int, timeout: float) -> int:
        """The stopped VM's state written to `fd` (a file's, opened for writing): the bytes
        written. The caller stops the VM first and continues it after."""
        deadline = time.monotonic() + timeout
        self.execute("getfd", {"fdname": "snapshot"}, fds=(fd,))
        self.execute("migrate", {"uri": "fd:snapshot"})
        while True:
            state = self.execute("query-migrate", timeout=max(0.1, deadline - time.monotonic()))
            status = state.get("status")
            if status == "completed":
                return int(state.get("ram", {}).get("transferred", 0))
            if status in ("failed", "cancelled"):
                raise SandboxError(f"QEMU could not save the VM: "
                                   f"{str(state.get('error-desc', status))[:300]}")
            if time.monotonic() > deadline:
                self.execute("migrate_cancel")
                raise SandboxError(f"QEMU did not save the VM within {timeout:g} s")
            time.sleep(_POLL)

    def resumed(self, timeout: float) -> None:
        """Wait for a QEMU started with `-incoming` to have read the state, then run it."""
        deadline = time.monotonic() + timeout
        while (status := self.execute("query-status")["status"]) == "inmigrate":
            if time.monotonic() > deadline:
                raise SandboxError(f"QEMU did not read the VM's state within {timeout:g} s")
            time.sleep(_POLL)
        if status not in ("paused", "running", "postmigrate"):
            raise SandboxError(f"QEMU could not resume the VM: {str(status)[:60]}")
        self.execute("cont")

    def _call(self, command: str, arguments: dict[str, Any] | None, fds: tuple[int, ...],
              deadline: float) -> Any:
        message = {"execute": command, **({"arguments": arguments} if arguments else {})}
        data = json.dumps(message).encode() + b"\n"
        try:
            if fds:
                socket.send_fds(self.sock, [data], list(fds))
            else:
                self.sock.sendall(data)
        except OSError as exc:
            raise SandboxError(f"QEMU's monitor: {exc.strerror or exc}") from None
        while True:
            answer = self._line(deadline)
            if "return" in answer:
                return answer["return"]
            if "error" in answer:
                desc = answer["error"].get("desc", "") if isinstance(answer["error"], dict) else ""
                raise SandboxError(f"QEMU refused {command}: {str(desc)[:300]}")
            # an event (or the greeting, had it come late): not the answer

    def _line(self, deadline: float) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxError("QEMU's monitor did not answer in time")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except OSError as exc:
                raise SandboxError(f"QEMU's monitor: {exc.strerror or 'timed out'}") from None
            if not chunk:
                raise SandboxError("QEMU's monitor closed (QEMU ended)")
            self._buffer += chunk
            if len(self._buffer) > _LINE_MAX:
                raise SandboxError("QEMU's monitor sent an overlong line")
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            answer = json.loads(line)
        except ValueError:
            raise SandboxError("QEMU's monitor sent what is not JSON") from None
        if not isinstance(answer, dict):
            raise SandboxError("QEMU's monitor sent what is not a JSON object")
        return answer
