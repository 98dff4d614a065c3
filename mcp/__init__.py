"""sealgate's MCP server (issue 29, docs/mcp.md): the tools a sandbox's policy declares, served
over MCP's Streamable HTTP, each call decided, dialed, injected, scrubbed, budgeted and audited
by the proxy's own code (`sealgate.proxy.calls`), so the agent never holds the credential.

It runs as a process of its own from a virtualenv of its own (`var/mcp-venv`, made by `make
deps`): the `mcp` SDK needs an h11 that mitmproxy, in the main virtualenv, does not allow.
`sealgate mcp serve` (cli.py, standard library only) execs that virtualenv's python on
`sealgate.mcp.sdk.serve`. Only `sdk/` imports the SDK; the rest (the call, the gate in front of
the SDK, the service's state) imports none of it and no mitmproxy.

The repository's folder is `mcp/`, installed as `sealgate.mcp` (pyproject's package-dir); with
the repository's root on `sys.path` (`python -m ...` run from it) that folder would shadow the
SDK's own top-level `mcp`, so say so at once rather than fail somewhere inside the SDK.
"""

if __name__ == "mcp":  # imported as the top-level `mcp`: the working directory is on sys.path
    raise ImportError(
        "this is sealgate's mcp/ folder (sealgate.mcp), found as the top-level `mcp` because "
        "the repository's root is on sys.path: run python with -P, or from another directory")
