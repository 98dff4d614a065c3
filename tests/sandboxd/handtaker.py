"""A successor that stops halfway, for tests/sandboxd/test_adopt_faults.py: run as
`python -m tests.sandboxd.handtaker HANDOVER_SOCKET WANT_JSON MODE [API_SOCKET]`.

It takes a daemon's hand-over as `sandbox.daemon.adopt` does, up to a point given by MODE:
`received` (everything received, nothing more) or `committed` (the leases then rewritten in
its name, under the links' lock: the commit); it says which on stdout and holds it all until
its stdin closes. With API_SOCKET it then also serves that socket's hand-over to a real
successor as the old daemon would, but every slot twice (each time with descriptors of its
own), and prints the successor's answer."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from sealgate.sandbox.daemon import handover
from sealgate.sandbox.host import lease, network

Message = tuple[dict[str, Any], list[int]]


def take(path: str, want: dict[str, Any], mode: str) -> tuple[list[Message], Message]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(60)
    sock.connect(path)
    handover.send(sock, {"sealgate": handover.MAGIC, "version": handover.VERSION,
                         "want": want})
    offer, _ = handover.receive(sock)
    slots = [handover.receive(sock) for _ in range(int(offer["offer"]))]
    end = handover.receive(sock)
    if mode == "committed":
        with network.lock():
            for message, _ in slots:
                record = message["slot"]
                was = json.loads(network.lease_path(record["index"]).read_text())
                lease.take(record["index"], Path(was["state"]), was["address"],
                           Path(record["groups"][0]).name)
    _held.append(sock)  # open until we exit: the old daemon sees no end before then
    return slots, end


def relay(api: Path, slots: list[Message], end: Message) -> str:
    """Serve `api`'s hand-over to its successor, every slot twice; its answer."""
    path = handover.path_for(Path(json.loads(sys.argv[2])["state"]), api)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as server:
        server.bind(str(path))
        server.listen(1)
        server.settimeout(60)
        print("serving", flush=True)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(60)
            handover.receive(conn)  # its hello
            handover.send(conn, {"offer": 2 * len(slots), "pid": os.getpid()})
            for message, fds in slots + slots:
                copies = [os.dup(fd) for fd in fds]
                handover.send(conn, message, copies)
                handover.close(copies)
            handover.send(conn, end[0], end[1])
            answer, _ = handover.receive(conn)
        path.unlink()
    return json.dumps(answer)


_held: list[socket.socket] = []

if __name__ == "__main__":
    got, last = take(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3])
    print(sys.argv[3], flush=True)
    if len(sys.argv) > 4:
        print(relay(Path(sys.argv[4]), got, last), flush=True)
    sys.stdin.read()
