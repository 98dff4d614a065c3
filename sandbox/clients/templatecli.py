"""`sealgate template build NAME --image IMAGE --sandbox ID --run CMD ...`: an image plus setup
commands, captured as a new image (the E2B and Daytona template flow), through the daemon.

The commands run once, in order, in a sandbox of the image under its sandbox id's policy (so an
install reaches only what that policy allows, through the proxy); their output streams to our
stderr. If every one exits 0 the sandbox's filesystem is snapshotted as NAME, a template that
belongs to that sandbox id like any snapshot; then the sandbox is deleted, whatever happened.
Sandboxes are then created from NAME exactly as from an image.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from .client import Result, Sandbox
from .sessioncli import client_args, client_of, refusing

_FAILED = 1


def build(name: str, *, image: str, sandbox: str, commands: Sequence[str],
          daemon: str | None = None, key: str | None = None,
          timeout: float = 1800.0) -> dict[str, Any] | Result:
    """The template's image record, or the Result of the first command that failed (then no
    image is made). Each command is run by `/bin/sh -c`; output goes to stderr."""
    with Sandbox.create(sandbox, image=image, daemon=daemon, key=key, call_timeout=120) as sb:
        for command in commands:
            sys.stderr.write(f"template {name}: $ {command}\n")
            result = None
            for _, data in sb.stream(["/bin/sh", "-c", command], timeout=timeout):
                if isinstance(data, Result):
                    result = data
                else:
                    sys.stderr.buffer.write(data)
                    sys.stderr.flush()
            if result is None or not result.ok:
                return result or Result(None, ending="lost")
        return sb.snapshot(name)


def register(sub: Any) -> None:
    t = sub.add_parser("template", help="build a template: an image plus setup commands, kept "
                                        "as an image (sandboxd)")
    ts = t.add_subparsers(dest="action", metavar="ACTION", required=True)
    b = ts.add_parser("build", help="run setup commands in a sandbox of an image and keep the "
                                    "result as a new image")
    client_args(b)
    b.add_argument("name", help="the template's name in the daemon's image store")
    b.add_argument("--image", required=True, help="the image it starts from")
    b.add_argument("--sandbox", required=True,
                   help="the sandbox id (its policy) the setup runs under and the template "
                        "belongs to")
    b.add_argument("--run", action="append", required=True, metavar="COMMAND",
                   help="a setup command, run by /bin/sh -c (repeatable, in order)")
    b.add_argument("--timeout", type=float, default=1800.0,
                   help="each command's limit in seconds (default 1800)")
    b.add_argument("--json", action="store_true", help="print the template's record as JSON")
    b.set_defaults(func=refusing(_build))


def _build(args: argparse.Namespace) -> int:
    made = build(args.name, image=args.image, sandbox=args.sandbox, commands=args.run,
                 daemon=args.daemon, key=client_of(args).key, timeout=args.timeout)
    if isinstance(made, Result):
        how = made.error or f"{made.ending} {made.exit_code}"
        print(f"sealgate: template {args.name}: a setup command failed ({how}); no template "
              "made", file=sys.stderr)
        return _FAILED
    print(json.dumps(made, indent=2) if args.json else made["name"])
    return 0
