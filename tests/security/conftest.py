"""Fixtures the base-URL framing suites share (test_baseurl_framing.py, test_baseurl_answers.py):
the strict origin of tests/framingorigin.py, a proxy that lets bot-1 send it anything, and a
fresh `Base` (the request maker) per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.dnsstub import StubDNS
from tests.framingorigin import Base, FramingOrigin, rules
from tests.harness import OriginCA, Proxy, ProxyFactory


@pytest.fixture(scope="module")
def framing_origin(test_ca: OriginCA, dns: StubDNS) -> Iterator[FramingOrigin]:
    dns.set("frame.test", "A 127.0.0.1")
    server = FramingOrigin(test_ca.issue("frame.test"))
    yield server
    server.stop()


@pytest.fixture(scope="module", params=["fast-path", "mitmproxy"])
def framing_proxy(request: pytest.FixtureRequest, proxy_with: ProxyFactory,
                  framing_origin: FramingOrigin) -> Iterator[Proxy]:
    """Each suite runs against both engines that serve base-URL requests: the fast path
    (proxy/engine/fastpath.py) and, with it turned off, mitmproxy's layers. A message the two
    framed differently would be a smuggled one: both must give the same outcome."""
    options = ["--set", "sealgate_fast_path=false"] if request.param == "mitmproxy" else []
    with proxy_with(rules(framing_origin.port), name="baseurl-framing", options=options,
                    clean_stderr=True) as p:
        yield p


@pytest.fixture()
def base(framing_proxy: Proxy, framing_origin: FramingOrigin) -> Base:
    framing_origin.reset()
    return Base(framing_proxy.port, framing_origin.port)
