"""A warm pool of booted, idle microVMs: the first command of a sandbox taken from it waits
for no boot.

Each VM is booted fresh for the pool and used by one taker only, then killed: a VM is never
handed out twice, and none is restored from a snapshot, so no two sandboxes ever share a
guest's memory, its random state or anything a command left. The pool boots a replacement in
the background as each one is taken.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from sealgate.sandbox.errors import SandboxError
from sealgate.sandbox.microvm.channel import Channel
from sealgate.sandbox.microvm.vm import Machine, Spec

BOOT_SECONDS = 60.0


@dataclass
class Booted:
    machine: Machine
    channel: Channel

    def close(self) -> None:
        self.machine.kill()


def boot(spec: Spec, timeout: float = BOOT_SECONDS,
         started: Callable[[Machine], None] = lambda _: None) -> Booted:
    """A VM whose agent has answered. Raises SandboxError (the VM killed) if it did not."""
    machine = Machine(spec)
    started(machine)
    channel = Channel(machine.sock)
    try:
        channel.wait_ready(timeout)
    except SandboxError as exc:
        raise SandboxError(f"{exc}: {machine.failure()}") from None
    return Booted(machine, channel)


class Pool:
    def __init__(self, spec: Callable[[], Spec], size: int) -> None:
        self._spec = spec
        self._ready: queue.Queue[Booted | SandboxError] = queue.Queue()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._booting: set[Machine] = set()
        self._threads: list[threading.Thread] = []
        for _ in range(size):
            self._refill()

    def _refill(self) -> None:
        thread = threading.Thread(target=self._boot_one, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _started(self, machine: Machine) -> None:
        with self._lock:
            self._booting.add(machine)
        if self._closed.is_set():
            machine.kill()

    def _boot_one(self) -> None:
        try:
            booted: Booted | SandboxError = boot(self._spec(), started=self._started)
        except SandboxError as exc:
            booted = exc
        with self._lock:
            if isinstance(booted, Booted):
                self._booting.discard(booted.machine)
            closed = self._closed.is_set()
        if closed and isinstance(booted, Booted):
            booted.close()
            return
        self._ready.put(booted)

    def idle(self) -> int:
        """How many booted VMs wait to be taken."""
        return self._ready.qsize()

    def take(self, timeout: float = BOOT_SECONDS) -> Booted:
        """A booted VM, for the caller alone (it kills it when done); a replacement boots."""
        try:
            got = self._ready.get(timeout=timeout)
        except queue.Empty:
            raise SandboxError(f"no microVM booted within {timeout:g} s") from None
        self._refill()
        if isinstance(got, SandboxError):
            raise got
        return got

    def close(self) -> None:
        """Kill every idle VM, and those still booting once they are up."""
        self._closed.set()
        with self._lock:
            booting = list(self._booting)
        for machine in booting:  # its boot then fails at once, and its thread ends
            machine.proc.kill()
        for thread in self._threads:
            thread.join(BOOT_SECONDS)
        while True:
            try:
                got = self._ready.get_nowait()
            except queue.Empty:
                return
            if isinstance(got, Booted):
                got.close()
