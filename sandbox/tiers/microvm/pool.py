"""A warm pool of booted, idle microVMs: the first command of a sandbox taken from it waits
for no boot.

Each VM is booted fresh for the pool and used by one taker only, then killed: a VM is never
handed out twice, and none is restored from a snapshot, so no two sandboxes ever share a
guest's memory, its random state or anything a command left. The pool boots a replacement in
the background as each one is taken.

`Pool` holds VMs without a network, all started by one process. `sealgate sandboxd
--isolation microvm` keeps its warm pool as slots instead (`sandbox.daemon.slot`): each VM needs its
own namespace, tap and cgroups, with a root launcher in them (`hostserve`), so each slot boots
its one VM there with `boot`, and the daemon's pool of slots is the pool of booted VMs, under
the same rule: one VM per sandbox, killed with it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ...errors import SandboxError
from .channel import Channel
from .vm import Machine, Spec

BOOT_SECONDS = 60.0


@dataclass
class Booted:
    machine: Machine
    channel: Channel

    def close(self) -> None:
        self.machine.kill()


def boot(spec: Spec, timeout: float = BOOT_SECONDS) -> Booted:
    """A VM whose agent has answered, started by (and living as long as) the calling thread.
    Raises SandboxError (the VM killed) if it did not answer."""
    machine = Machine(spec)
    channel = Channel(machine.sock)
    try:
        channel.wait_ready(timeout)
    except SandboxError as exc:
        raise SandboxError(f"{exc}: {machine.failure()}") from None
    return Booted(machine, channel)


class Pool:
    """`size` VMs kept booted. QEMU dies with the thread that started it (a parent-death
    signal belongs to the thread), so one thread starts them all and lives as long as the
    pool: a VM taken lives until its taker closes it or the pool is closed."""

    def __init__(self, spec: Callable[[], Spec], size: int) -> None:
        self._spec = spec
        self._ready: queue.Queue[Booted | SandboxError] = queue.Queue()
        self._requests: queue.Queue[bool] = queue.Queue()  # True: boot one; False: stop
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._booting: set[Machine] = set()
        self._spawner = threading.Thread(target=self._spawn, daemon=True)
        self._spawner.start()
        for _ in range(size):
            self._requests.put(True)

    def _spawn(self) -> None:
        while self._requests.get() and not self._closed.is_set():
            try:
                machine = Machine(self._spec())
            except SandboxError as exc:
                self._ready.put(exc)
                continue
            with self._lock:
                self._booting.add(machine)
            threading.Thread(target=self._wait, args=(machine,), daemon=True).start()

    def _wait(self, machine: Machine) -> None:
        channel = Channel(machine.sock)
        try:
            channel.wait_ready(BOOT_SECONDS)
            channel.seal()  # nothing to stage in these: the root read-only now, not at a take
            booted: Booted | SandboxError = Booted(machine, channel)
        except SandboxError as exc:
            booted = SandboxError(f"{exc}: {machine.failure()}")
        with self._lock:
            self._booting.discard(machine)
            closed = self._closed.is_set()
        if closed and isinstance(booted, Booted):
            booted.close()
            return
        self._ready.put(booted)

    def idle(self) -> int:
        """How many booted VMs wait to be taken."""
        return self._ready.qsize()

    def take(self, timeout: float = BOOT_SECONDS) -> Booted:
        """A booted VM, for the caller alone (it closes it when done); a replacement boots."""
        try:
            got = self._ready.get(timeout=timeout)
        except queue.Empty:
            raise SandboxError(f"no microVM booted within {timeout:g} s") from None
        self._requests.put(True)
        if isinstance(got, SandboxError):
            raise got
        return got

    def close(self) -> None:
        """Kill every VM of the pool's: idle, booting, and taken ones not yet closed."""
        self._closed.set()
        self._requests.put(False)
        with self._lock:
            booting = list(self._booting)
        for machine in booting:  # its boot then fails at once
            machine.proc.kill()
        self._spawner.join(BOOT_SECONDS)
        while True:
            try:
                got = self._ready.get_nowait()
            except queue.Empty:
                return
            if isinstance(got, Booted):
                got.close()
