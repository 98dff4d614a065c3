"""`sealgate mcp serve`'s options survive the exec into the MCP virtualenv: the CLI hands on
what it parsed (`to_argv`), and the server's process parses it back to the same values."""

from __future__ import annotations

import argparse

from sealgate.mcp import cli
from sealgate.mcp.options import add_gateway_options, add_serve_options, to_argv


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_serve_options(parser)
    return parser


def test_every_option_is_handed_on_as_given() -> None:
    given = ["--listen", "[::1]:9000", "--rules", "r.yaml", "--state", "s", "--resolver",
             "127.0.0.1:53", "--upstream-ca", "ca.pem", "--audit-log", "off", "--max-body", "77",
             "--secret-store", "file:a.yaml", "--secret-store", "env:X_",
             "--sandbox-network", "10.9.0.0/16"]
    first = _parser().parse_args(given)
    again = _parser().parse_args(to_argv(first))
    assert vars(again) == vars(first)
    assert again.secret_store == ["file:a.yaml", "env:X_"] and again.max_body == 77


def test_the_server_runs_with_minus_p_in_the_mcp_virtualenv() -> None:
    sub = argparse.ArgumentParser().add_subparsers()
    cli.register(sub)
    args = sub.choices["mcp"].parse_args(["serve", "--python", "/venv/bin/python"])
    assert cli.command(args)[:4] == ["/venv/bin/python", "-P", "-m", "sealgate.mcp.sdk.serve"]
    args = sub.choices["mcp"].parse_args(["serve"])
    assert cli.command(args)[0].endswith("var/mcp-venv/bin/python") or args.python


def test_the_gateway_runs_its_own_module_with_the_same_options() -> None:
    sub = argparse.ArgumentParser().add_subparsers()
    cli.register(sub)
    args = sub.choices["mcp"].parse_args(["gateway", "--python", "/venv/bin/python",
                                          "--rules", "r.yaml", "--max-body", "9"])
    argv = cli.command(args)
    assert argv[:4] == ["/venv/bin/python", "-P", "-m", "sealgate.mcp.sdk.gateway"]
    assert argv[argv.index("--listen") + 1] == "127.0.0.1:8766"
    assert "--stdio" not in argv and argv[argv.index("--max-body") + 1] == "9"
    parser = argparse.ArgumentParser()
    add_gateway_options(parser)
    assert parser.parse_args(argv[4:]).rules == "r.yaml"
