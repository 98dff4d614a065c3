"""`sealgate sandbox files ACTION ID ...`: the workspace's files beyond put and get, a thin
client of `Sandbox.files` (`files`): ls, stat, mkdir, rm, mv, upload and download of a
directory (as a tar stream), and watch (one JSON event a line until interrupted).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from .client import Sandbox
from .sessioncli import client_args, client_of, refusing


def register(ps: Any) -> None:
    f = ps.add_parser("files", help="list, stat, mkdir, rm, mv, upload or download a "
                                    "directory, or watch, in a sandbox's workspace")
    fs = f.add_subparsers(dest="files_action", metavar="ACTION", required=True)

    def action(name: str, text: str, *paths: str) -> argparse.ArgumentParser:
        one: argparse.ArgumentParser = fs.add_parser(name, help=text)
        client_args(one)
        one.add_argument("id")
        for path in paths:
            one.add_argument(path)
        return one

    ls = action("ls", "a directory's entries (default the workspace)")
    ls.add_argument("path", nargs="?", default="")
    ls.add_argument("--json", action="store_true", help="one JSON object per entry")
    action("stat", "one entry, as JSON", "path")
    mk = action("mkdir", "make a directory", "path")
    mk.add_argument("-p", "--parents", action="store_true", help="its parents too; no error "
                                                                  "if it is there")
    rm = action("rm", "remove a file, link or empty directory", "path")
    rm.add_argument("-r", "--recursive", action="store_true", help="a whole tree")
    action("mv", "rename", "source", "target")
    up = action("upload", "a local directory's content into a workspace directory", "local")
    up.add_argument("path", nargs="?", default="")
    action("download", "a workspace directory into a local one", "path", "local")
    watch = action("watch", "one JSON event a line as the directory changes, until Ctrl-C")
    watch.add_argument("path", nargs="?", default="")
    watch.add_argument("--no-recursive", action="store_true",
                       help="the directory itself only, not those below it")
    for parser in fs.choices.values():
        parser.set_defaults(func=refusing(_run))


def _run(args: argparse.Namespace) -> int:
    try:
        return _do(args)
    except OSError as exc:  # the local side: a directory to upload or download into
        where = exc.filename or getattr(args, "local", "")
        print(f"sealgate: {where}: {exc.strerror or exc}", file=sys.stderr)
        return 2


def _do(args: argparse.Namespace) -> int:
    files = Sandbox(client_of(args), {"id": args.id}).files
    limit = args.call_timeout
    what = args.files_action
    if what == "ls":
        for entry in files.list(args.path, call_timeout=limit):
            print(json.dumps(dataclasses.asdict(entry)) if args.json else
                  f"{entry.type:<8}{entry.mode:>5o}{entry.size:>12}  {entry.path}"
                  + (f" -> {entry.target}" if entry.target is not None else ""))
    elif what == "stat":
        print(json.dumps(dataclasses.asdict(files.stat(args.path, call_timeout=limit))))
    elif what == "mkdir":
        files.mkdir(args.path, parents=args.parents, call_timeout=limit)
    elif what == "rm":
        files.remove(args.path, recursive=args.recursive, call_timeout=limit)
    elif what == "mv":
        files.rename(args.source, args.target, call_timeout=limit)
    elif what == "upload":
        done = files.upload_dir(args.local, args.path, call_timeout=limit)
        print(f"{done['entries']} entries, {done['size']} bytes", file=sys.stderr)
    elif what == "download":
        files.download_dir(args.path, args.local, call_timeout=limit)
    else:
        try:
            with files.watch(args.path, recursive=not args.no_recursive) as events:
                for event in events:
                    print(json.dumps(dataclasses.asdict(event)), flush=True)
        except KeyboardInterrupt:
            return 130
    return 0
