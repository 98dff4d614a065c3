"""`sealgate mcp gateway`'s process, in the MCP virtualenv (cli.py execs it):

    var/mcp-venv/bin/python -P -m sealgate.mcp.sdk.gateway --listen 127.0.0.1:8766 --rules rules

Builds the service (rules, guard, broker, pool, audit) as `sealgate mcp serve` does, and serves
the gateway (gateway.py, an ASGI app of sealgate's own: no SDK in the path of a message) with
uvicorn, `POST /mcp/<server>` for each server of the caller's policy's `mcp_servers`; says
`sealgate mcp gateway ready` on stderr once it listens, and stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..gateway import Gateway
from ..options import add_gateway_options
from ..service import Service, Settings
from .serve import resource_line, run, run_http, settings, url

__all__ = ["main"]


async def serve(config: Settings) -> None:
    service = Service.start(config)

    def ready() -> str:
        rules = service.rules
        servers = sorted({f"{s.name}" for p in rules.policies.values() for s in p.mcp_servers})
        return (f"sealgate mcp gateway ready\n  listening  {url(config)}/mcp/<server>\n"
                f"  rules      {config.rules}: {len(servers)} server(s)"
                f"{': ' + ', '.join(servers[:10]) if servers else ''}\n"
                f"{resource_line(config)}\n"
                f"  audit log  {config.audit_log or config.state / 'audit.log'}")

    await run_http(service, Gateway(service), ready, lifespan="off")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sealgate mcp gateway")
    add_gateway_options(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    return run("sealgate mcp gateway", lambda: serve(settings(args)))


if __name__ == "__main__":
    sys.exit(main())
