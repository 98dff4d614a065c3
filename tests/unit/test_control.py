"""The control API (proxy/control.py) in process, over aiohttp's test server."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from sealgate.proxy.process.control import make_app
from sealgate.proxy.request.registry import SourceRegistry

RULES = """
version: 1
policies: {p: {}}
sandboxes:
  bot-1: {policy: p, key_sha256: "%s"}
""" % ("ab" * 32)


def test_unwritable_registry_is_a_503_not_a_traceback(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(textwrap.dedent(RULES))
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # the registry's directory is a file: every write fails
    registry = SourceRegistry(blocker / "registry.json")

    async def scenario() -> tuple[int, dict[str, Any]]:
        server = TestServer(make_app(registry, rules), host="127.0.0.1")
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as session:
                url = str(server.make_url("/v1/sources/10.0.0.2"))
                async with session.put(url, json={"sandbox": "bot-1"}) as response:
                    return response.status, await response.json()
        finally:
            await server.close()

    status, body = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert (status, body["error"]) == (503, "registry_unavailable")


def test_the_registry_version_moves_only_with_the_map_and_never_repeats(tmp_path: Path) -> None:
    """What an open connection compares to know its address may belong to another sandbox
    now (proxy/request/steps.py): it changes with the map, not with a rewrite of the same map,
    and a registry made later (a rules reload makes one) never takes a version an earlier one
    had."""
    path = tmp_path / "registry.json"
    writer, reader = SourceRegistry(path), SourceRegistry(path)
    writer.register("10.0.0.1", "ci-bot")
    first = reader.version_now()
    assert reader.lookup("10.0.0.1") == "ci-bot"
    writer.register("10.0.0.1", "ci-bot")  # the file rewritten, the map the same
    assert reader.version_now() == first
    writer.register("10.0.0.1", "other-bot")
    assert reader.version_now() != first
    seen = {first, reader.version}
    for _ in range(3):  # a reload's new registries
        fresh = SourceRegistry(path)
        assert fresh.version not in seen and fresh.version_now() not in seen
        seen.add(fresh.version)
