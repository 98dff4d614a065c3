"""`sealgate sandbox create | exec | url | put | get | ls | rm`: a thin client of the daemon's API
(the same calls as `sealgate.sandbox.Sandbox`), for people and shell scripts.

`exec` streams the command's stdout and stderr to ours as they come and exits with its status
(124 for a time-out); a refusal of the daemon's, a daemon that cannot be reached or a call past
its `--call-timeout` is one line on stderr (its reason first) and exit 125. `--json` gives what
a machine reads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sealgate.reasons import Reason

from .client import DEFAULT, DEFAULT_DAEMON, CallLimit, Client, DaemonError, Result, Sandbox
from .clientshared import call_limit

_REFUSED = 125


def client_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--daemon", default=os.environ.get("SEALGATE_SANDBOXD"),
                        help=f"the daemon: a unix socket (default {DEFAULT_DAEMON}) or "
                             "http(s)://host:port ($SEALGATE_SANDBOXD)")
    parser.add_argument("--key-file", type=Path,
                        help="the bearer key of a TCP daemon ($SEALGATE_SANDBOXD_KEY)")
    parser.add_argument("--call-timeout", type=_call_timeout, default=DEFAULT,
                        metavar="SECONDS",
                        help="the most the call may take before this client gives up "
                             "(client_timeout, exit 125); 0: no limit (default 60; exec: "
                             "its --timeout + 30; selftest: 300)")


def register(ps: Any) -> None:
    """Add the client's actions to `sealgate sandbox`'s subcommands."""

    c = ps.add_parser("create", help="create a long-lived sandbox (sandboxd); prints its id")
    client_args(c)
    c.add_argument("sandbox", help="the sandbox id the rules name (its policy)")
    c.add_argument("--ttl", type=float, help="seconds it may live (default 600)")
    c.add_argument("--idle-timeout", type=float,
                   help="seconds without a request before it ends (default 180)")
    c.add_argument("--pids", type=int, help="most processes and threads at once")
    c.add_argument("--memory", help="most memory, its writable layer included: 512M, 4G")
    c.add_argument("--cpus", type=float, help="CPU time in cores")
    c.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="a variable for every command of the sandbox (repeatable)")
    c.add_argument("--isolation", choices=("bwrap", "gvisor", "microvm"),
                   help="the tier required (refused if the daemon runs another)")
    c.add_argument("--image", help="its root: an image, template or snapshot of the "
                                    "daemon's store (default: the host's system, read-only)")
    c.add_argument("--metadata", action="append", default=[], metavar="NAME=VALUE",
                   help="a label (repeatable; `ls --metadata` finds it)")
    c.add_argument("--json", action="store_true", help="print the sandbox as JSON")
    c.set_defaults(func=refusing(_create))

    up = ps.add_parser("update", help="change a live sandbox: time left, idle timeout, labels, "
                                      "identity")
    client_args(up)
    up.add_argument("id")
    up.add_argument("--ttl", type=float, help="seconds left from now")
    up.add_argument("--idle-timeout", type=float, help="seconds without a request before it ends")
    up.add_argument("--metadata", action="append", metavar="NAME=VALUE",
                    help="its labels, all replaced (repeatable)")
    up.add_argument("--sandbox", help="another sandbox id of the rules: its policy from the "
                                      "next request on")
    up.add_argument("--json", action="store_true", help="print the sandbox as JSON")
    up.set_defaults(func=refusing(_update))

    for name, text in (("pause", "freeze every process of a sandbox"),
                       ("resume", "thaw a paused sandbox")):
        one = ps.add_parser(name, help=text)
        client_args(one)
        one.add_argument("id")
        one.set_defaults(func=refusing(_pause), pause=name == "pause")
    snap = ps.add_parser("snapshot", help="a sandbox's filesystem as a new image (its policy's)")
    client_args(snap)
    snap.add_argument("id")
    snap.add_argument("--name", help="the image's name (default: ID-<unix time>)")
    snap.add_argument("--json", action="store_true", help="print the image's record as JSON")
    snap.set_defaults(func=refusing(_snapshot))

    fork = ps.add_parser("fork", help="copies of a live sandbox resumed from one memory "
                                      "snapshot of it (the microVM tier, from an image)")
    client_args(fork)
    fork.add_argument("id")
    fork.add_argument("-n", type=int, default=1, help="how many copies (1 to 16; default 1)")
    fork.add_argument("--json", action="store_true", help="print the copies as JSON")
    fork.set_defaults(func=refusing(_fork))

    url = ps.add_parser("url", help="a signed URL of a sandbox's port, for a browser (no key)")
    client_args(url)
    url.add_argument("id")
    url.add_argument("port", type=int)
    url.add_argument("--expires-in", type=float, metavar="SECONDS",
                     help="how long it works (default an hour, or the daemon's maximum TTL if "
                          "shorter; at most that)")
    url.set_defaults(func=refusing(_url))

    e = ps.add_parser("exec", help="run a command in a sandbox, streaming its output")
    client_args(e)
    e.add_argument("id")
    e.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    e.add_argument("--cwd", help="where it runs (default /workspace)")
    e.add_argument("--timeout", type=float, default=600.0,
                   help="seconds, then it and all it started are killed: exit 124 (default 600)")
    e.add_argument("-i", "--stdin", action="store_true", help="pass our stdin to it")
    e.add_argument("--json", action="store_true",
                   help="print one JSON object at the end (output in base64) instead")
    e.add_argument("command", nargs="+", metavar="-- COMMAND")
    e.set_defaults(func=refusing(_exec))

    put = ps.add_parser("put", help="copy a local file into a sandbox's workspace")
    client_args(put)
    put.add_argument("id")
    put.add_argument("local", help="a local file, or - for stdin")
    put.add_argument("path", help="where in /workspace (relative)")
    put.add_argument("--mode", type=_octal, default=0o644, help="octal permissions (default 644)")
    put.set_defaults(func=refusing(_put))

    get = ps.add_parser("get", help="copy a file of a sandbox's workspace out")
    client_args(get)
    get.add_argument("id")
    get.add_argument("path", help="a path in /workspace (relative)")
    get.add_argument("local", nargs="?", default="-", help="a local file (default - : stdout)")
    get.set_defaults(func=refusing(_get))

    ls = ps.add_parser("ls", help="list the daemon's sandboxes")
    client_args(ls)
    ls.add_argument("--metadata", action="append", default=[], metavar="NAME=VALUE",
                    help="only sandboxes with this label (repeatable: all of them)")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=refusing(_ls))

    st = ps.add_parser("selftest", help="have the daemon prove its network boundary: a canary "
                                        "sandbox tries every forbidden way out")
    client_args(st)
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=refusing(_selftest))

    rm = ps.add_parser("rm", help="delete sandboxes (everything of them)")
    client_args(rm)
    rm.add_argument("ids", nargs="+", metavar="ID")
    rm.set_defaults(func=refusing(_rm))


def _call_timeout(text: str) -> CallLimit:
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"seconds, 0 for no limit: {text[:16]!r}")
    return seconds or None


def _octal(text: str) -> int:
    try:
        return int(text, 8) & 0o777
    except ValueError:
        raise argparse.ArgumentTypeError(f"not octal permissions: {text[:16]!r}") from None


def client_of(args: argparse.Namespace) -> Client:
    key = None
    if args.key_file is not None:
        try:
            key = args.key_file.read_text().strip()
        except OSError as exc:
            raise DaemonError(f"--key-file {args.key_file}: {exc.strerror}",
                              reason=Reason.BAD_REQUEST, status=0) from None
    return Client(args.daemon, key)


def pairs(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise DaemonError(f"--env {name[:40]!r}: write NAME=VALUE",
                              reason=Reason.BAD_REQUEST, status=0)
        env[name] = value
    return env


def refusing(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A refusal of the daemon's (or a client error before the call) is one line and 125."""
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except DaemonError as exc:
            return _refused(exc)
    return run


def _refused(exc: DaemonError) -> int:
    print(f"sealgate: {exc}", file=sys.stderr)
    return _REFUSED


def _create(args: argparse.Namespace) -> int:
    limits: dict[str, Any] = {k: v for k, v in (("pids", args.pids), ("memory", args.memory),
                                                 ("cpus", args.cpus)) if v is not None}
    sb = Sandbox.create(args.sandbox, limits=limits or None, env=pairs(args.env) or None,
                        ttl=args.ttl, idle_timeout=args.idle_timeout,
                        isolation=args.isolation, image=args.image,
                        metadata=pairs(args.metadata) or None, daemon=args.daemon,
                        key=client_of(args).key, call_timeout=args.call_timeout)
    print(json.dumps(sb.info, indent=2) if args.json else sb.id)
    return 0


def _update(args: argparse.Namespace) -> int:
    if (args.ttl, args.idle_timeout, args.metadata, args.sandbox) == (None,) * 4:
        print("sealgate: say what to change: --ttl, --idle-timeout, --metadata or --sandbox",
              file=sys.stderr)
        return 2
    info = Sandbox(client_of(args), {"id": args.id}).update(
        ttl=args.ttl, idle_timeout=args.idle_timeout,
        metadata=None if args.metadata is None else pairs(args.metadata),
        sandbox=args.sandbox, call_timeout=args.call_timeout)
    print(json.dumps(info, indent=2) if args.json else info["id"])
    return 0


def _pause(args: argparse.Namespace) -> int:
    sb = Sandbox(client_of(args), {"id": args.id})
    (sb.pause if args.pause else sb.resume)(call_timeout=args.call_timeout)
    return 0


def _snapshot(args: argparse.Namespace) -> int:
    made = Sandbox(client_of(args), {"id": args.id}).snapshot(args.name,
                                                              call_timeout=args.call_timeout)
    print(json.dumps(made, indent=2) if args.json else made["name"])
    return 0


def _fork(args: argparse.Namespace) -> int:
    copies = Sandbox(client_of(args), {"id": args.id}).fork(args.n,
                                                            call_timeout=args.call_timeout)
    print(json.dumps([c.info for c in copies], indent=2) if args.json
          else "\n".join(c.id for c in copies))
    return 0


def _url(args: argparse.Namespace) -> int:
    print(Sandbox(client_of(args), {"id": args.id}).url(
        args.port, expires_in=args.expires_in, call_timeout=args.call_timeout))
    return 0


def _exec(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    sb = Sandbox(client_of(args), {"id": args.id})
    stdin = sys.stdin.buffer.read() if args.stdin else None
    out, err = sys.stdout.buffer, sys.stderr.buffer
    result: Result | None = None
    if args.json:
        result = sb.run(command, env=pairs(args.env), cwd=args.cwd, stdin=stdin,
                        timeout=args.timeout, call_timeout=args.call_timeout)
    else:
        for name, data in sb.stream(command, env=pairs(args.env), cwd=args.cwd, stdin=stdin,
                                    timeout=args.timeout, call_timeout=args.call_timeout):
            if isinstance(data, Result):
                result = data
                break
            target = out if name == "stdout" else err
            target.write(data)
            target.flush()
    assert result is not None
    if args.json:
        import base64

        print(json.dumps({"exit": result.exit_code, "ending": result.ending,
                          "signal": result.signal, "usage": dict(result.usage),
                          "duration_ms": result.duration_ms, "error": result.error,
                          "stdout": base64.b64encode(result.stdout).decode(),
                          "stderr": base64.b64encode(result.stderr).decode()}))
    elif result.error:
        print(f"sealgate: {result.error}", file=sys.stderr)
    if result.exit_code is None:
        print("sealgate: the command was lost (its supervisor in the sandbox was killed)",
              file=sys.stderr)
        return _REFUSED
    return result.exit_code


def _put(args: argparse.Namespace) -> int:
    try:
        data = sys.stdin.buffer.read() if args.local == "-" else Path(args.local).read_bytes()
    except OSError as exc:
        print(f"sealgate: {args.local}: {exc.strerror}", file=sys.stderr)
        return 2
    size = Sandbox(client_of(args), {"id": args.id}).write(args.path, data, mode=args.mode,
                                                         call_timeout=args.call_timeout)
    print(f"{args.path}: {size} bytes", file=sys.stderr)
    return 0


def _get(args: argparse.Namespace) -> int:
    data = Sandbox(client_of(args), {"id": args.id}).read(args.path,
                                                        call_timeout=args.call_timeout)
    if args.local == "-":
        sys.stdout.buffer.write(data)
        return 0
    try:
        Path(args.local).write_bytes(data)
    except OSError as exc:
        print(f"sealgate: {args.local}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


def _ls(args: argparse.Namespace) -> int:
    sandboxes = client_of(args).list(metadata=pairs(args.metadata),
                                     call_timeout=args.call_timeout)
    if args.json:
        print(json.dumps(sandboxes, indent=2))
        return 0
    rows = [("ID", "SANDBOX", "IMAGE", "ADDRESS", "UID", "CMDS", "RUNNING", "EXPIRES", "IDLE",
             "METADATA")]
    rows += [(s["id"], s["sandbox"], s.get("image") or "-", s["address"],
              "-" if s.get("uid") is None else str(s["uid"]),
              str(s["commands"]), str(s["running"]) + (" paused" if s.get("paused") else ""),
              f"{s['expires_in']:.0f}s", f"{s['idle_for']:.0f}s",
              ",".join(f"{k}={v}" for k, v in sorted(s.get("metadata", {}).items())) or "-")
             for s in sandboxes]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _rm(args: argparse.Namespace) -> int:
    code = 0
    client = client_of(args)
    for ident in args.ids:
        try:
            client.call("DELETE", f"/v1/sandboxes/{quote(ident, safe='')}",
                        call_timeout=args.call_timeout)
        except DaemonError as exc:  # the others are still deleted
            code = _refused(exc)
    return code


def _selftest(args: argparse.Namespace) -> int:
    answer = client_of(args).call("GET", "/v1/selftest", call_timeout=call_limit(args.call_timeout,
                                                                                300.0))
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        for check in answer.get("checks", []):
            mark = "ok  " if check["ok"] else "FAIL"
            print(f"{mark}  {check['name']}: {check['detail']}")
        print("self-test " + ("passed" if answer.get("ok") else "FAILED: the daemon will not "
                              "create sandboxes until it passes"))
    return 0 if answer.get("ok") else 1
