"""Limits a hostile command cannot talk its way past: the rate of its name server's answers.
"""

from __future__ import annotations

import pytest

from sandbox.dns import BURST, RATE
from tests.harness import Proxy
from tests.integration import test_sandbox as base

pytestmark = pytest.mark.root

gateway, sproxy = base.gateway, base.sproxy  # this module's own sandbox gateway and proxy

# One socket, one source port, as fast as it can send: conntrack sees one established flow.
FLOOD = r"""
import socket, time
server = next(l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver"))
query = bytes.fromhex("123401000001000000000000") + b"\x01a\x04test\x00\x00\x01\x00\x01"
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setblocking(False)
sent = answers = 0
end = time.monotonic() + WINDOW
while time.monotonic() < end:
    try:
        s.sendto(query, (server, 53)); sent += 1
    except OSError:
        pass
    try:
        while True:
            s.recv(512); answers += 1
    except OSError:
        pass
s.settimeout(DRAIN)
try:
    while True:
        s.recv(512); answers += 1
except OSError:
    pass
print(sent, answers)
"""


def test_a_flood_of_queries_gets_no_more_answers_than_the_rate(sproxy: Proxy) -> None:
    window, drain = 1.5, 0.3
    probe = FLOOD.replace("WINDOW", str(window)).replace("DRAIN", str(drain))
    done = base.run(sproxy, "python3", "-c", probe)
    assert done.returncode == 0, done.stderr
    sent, answers = map(int, done.stdout.split())
    allowed = BURST + RATE * (window + drain)
    assert sent > 10 * allowed  # a flood indeed
    assert RATE <= answers <= allowed * 1.25, (sent, answers)
