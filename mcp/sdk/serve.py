"""`sealgate mcp serve`'s process, in the MCP virtualenv (cli.py execs it):

    var/mcp-venv/bin/python -P -m sealgate.mcp.sdk.serve --listen 127.0.0.1:8765 --rules rules

Builds the service (rules, guard, broker, audit), serves the app (server.py) with uvicorn on
the address given, says `sealgate mcp ready` on stderr once it listens, and stops on SIGTERM or
SIGINT (uvicorn's own handling: in-flight calls finish first). With `--stdio`, the same server
for one client over stdin and stdout, the caller being `--sandbox` (or the default policy),
until stdin ends.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Literal

import uvicorn
from mcp.server.stdio import stdio_server

from sealgate.proxy.calls import Decision, RulesError

from ..bearer import metadata_url
from ..options import add_serve_options
from ..protected import Protected
from ..service import Service, Settings, listen_address, listen_resource
from .conngate import bounded_protocol
from .server import app, mcp_server

__all__ = ["main", "resource_line", "run_http", "settings"]


def settings(args: argparse.Namespace) -> Settings:
    listen = listen_address(args.listen)
    return Settings(
        listen=listen, rules=Path(args.rules), state=Path(args.state),
        resource=args.resource or listen_resource(listen),
        resolver=args.resolver, upstream_ca=Path(args.upstream_ca) if args.upstream_ca else None,
        secret_stores=tuple(args.secret_store), sandbox_networks=tuple(args.sandbox_network),
        audit_log=args.audit_log, max_body=args.max_body,
        authorization_servers=tuple(args.authorization_server))


async def serve(config: Settings) -> None:
    service = Service.start(config)

    def ready() -> str:
        rules = service.rules
        tools = sum(len(p.tools) for p in rules.policies.values())
        servers = sum(len(p.mcp_servers) for p in rules.policies.values())
        return (f"sealgate mcp ready\n  listening  {url(config)}/mcp\n"
                f"  rules      {config.rules}: {len(rules.policies)} policies, {tools} tool(s)\n"
                + (f"  gateway    {url(config)}/mcp/<server>: {servers} upstream server(s)\n"
                   if servers else "")
                + f"{resource_line(config)}\n"
                + f"  audit log  {config.audit_log or config.state / 'audit.log'}")

    await run_http(service, app(service), ready, lifespan="on")


async def run_http(service: Service, served: Any, ready: Callable[[], str], *,
                   lifespan: Literal["on", "off"]) -> None:
    """`served` on the settings' address with uvicorn, `ready()` said on stderr once it
    listens, until SIGTERM or SIGINT (in-flight requests finish first); then the service
    closed. The resource metadata (protected.py) is served in front of it."""
    host, port = service.settings.listen
    server = uvicorn.Server(uvicorn.Config(
        Protected(served, service.settings), host=host, port=port, log_level="warning",
        access_log=False, lifespan=lifespan, timeout_keep_alive=5, timeout_graceful_shutdown=10,
        http=bounded_protocol(),  # per caller and in time: conngate.py
        limit_concurrency=512,  # connections; past it 503 at once
        h11_max_incomplete_event_size=64 * 1024, server_header=False,
        # The peer's address is who calls (a sandbox's, by the source registry): never what
        # a header says it is. uvicorn trusts X-Forwarded-For from loopback by default, which
        # let any local process name a registered sandbox's address (found by review).
        proxy_headers=False, forwarded_allow_ips=""))
    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    if server.started:
        print(ready(), file=sys.stderr, flush=True)
    try:
        await task
    finally:
        await service.close()


def resource_line(config: Settings) -> str:
    """The ready banner's line for bearer tokens: the audience they must name, where the
    metadata is."""
    return (f"  resource   {config.resource} (bearer tokens' audience; metadata "
            f"{metadata_url(config.resource)})")


def url(config: Settings) -> str:
    host, port = config.listen
    return f"http://{args_host(host)}:{port}"


async def serve_stdio(config: Settings, sandbox: str | None) -> None:
    """One client over stdin and stdout (the SDK's transport: while it serves, fd 1 is stderr
    for everything else, so nothing but JSON-RPC reaches the client)."""
    service = Service.start(config)
    try:
        if sandbox is not None and sandbox not in service.rules.sandboxes:
            raise ValueError(f"--sandbox {sandbox[:64]!r}: no such sandbox in the rules")
        server = mcp_server(service, lambda _: service.named(sandbox))
        policy = service.policy(service.named(sandbox))
        tools = 0 if isinstance(policy, Decision) else len(policy.tools)
        print(f"sealgate mcp ready (stdio)\n  caller     {sandbox or 'the default policy'}: "
              f"{tools} tool(s)", file=sys.stderr, flush=True)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        await service.close()


def args_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sealgate mcp serve")
    add_serve_options(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.sandbox is not None and not args.stdio:
        parser.error("--sandbox goes with --stdio (over HTTP the caller proves who it is)")
    if args.stdio:
        return run("sealgate mcp", lambda: serve_stdio(settings(args), args.sandbox))
    return run("sealgate mcp", lambda: serve(settings(args)))


def run(prog: str, work: Callable[[], Coroutine[Any, Any, None]]) -> int:
    """A process's service run to its end: 2 with one line for bad rules or settings (no
    traceback), 0 on an interrupt or when it stops."""
    try:
        asyncio.run(work())
    except (RulesError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
