"""`sealgate image pull REF | import PATH [--name N] | ls [--json] | rm NAME | gc [--json]`:
the image store (store.py) from the command line.

`--store DIR` (before or after the subcommand) picks the store; the default is `images/` in
the state directory sandboxd uses (`$SEALGATE_STATE`, else `var`). Progress goes to stderr,
results to stdout; an error is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sealgate.clikit import Subcommands

from .errors import ImageError
from .record import Image, human, short
from .store import Store

HELP = "the image store: pull, import, list, remove and collect OCI images"


def default_store() -> Path:
    return Path(os.environ.get("SEALGATE_STATE", "var")) / "images"


def register(sub: Subcommands) -> None:
    p = sub.add_parser("image", help=HELP, description=HELP)
    p.add_argument("--store", type=Path, default=default_store(),
                   help=f"the store's directory (default {default_store()})")
    commands = p.add_subparsers(dest="image_command", metavar="COMMAND", required=True)
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument("--store", type=Path, default=argparse.SUPPRESS,
                       help="the store's directory")

    pull = commands.add_parser("pull", parents=[store],
                               help="pull an image from its registry (skopeo) and import it")
    pull.add_argument("ref", metavar="REF", help="like debian:12 or ghcr.io/org/img@sha256:...")
    pull.add_argument("--cert-dir", type=Path, metavar="DIR",
                      help="a private registry's CA certificates (*.crt), and a client "
                           "certificate (*.cert, *.key) if it asks for one: skopeo's "
                           "--src-cert-dir")
    pull.set_defaults(func=_pull)
    imp = commands.add_parser("import", parents=[store],
                              help="import an OCI image layout directory or oci-archive file")
    imp.add_argument("path", metavar="PATH", type=Path)
    imp.add_argument("--name", help="the image's name (default: its manifest digest)")
    imp.set_defaults(func=_import)
    ls = commands.add_parser("ls", parents=[store], help="list the images")
    ls.add_argument("--json", action="store_true", help="one JSON list of the image records")
    ls.set_defaults(func=_ls)
    rm = commands.add_parser("rm", parents=[store],
                             help="remove an image's record (gc frees its layers)")
    rm.add_argument("name", metavar="NAME", help="a name, or a digest or its prefix")
    rm.set_defaults(func=_rm)
    gc = commands.add_parser("gc", parents=[store],
                             help="remove layers and blobs no image references")
    gc.add_argument("--json", action="store_true", help="what went, as a JSON list")
    gc.set_defaults(func=_gc)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _open(args: argparse.Namespace) -> Store:
    return Store(args.store)


def _pull(args: argparse.Namespace) -> int:
    return _safely(lambda: _print_image(_open(args).pull(args.ref, _progress,
                                                         cert_dir=args.cert_dir)))


def _import(args: argparse.Namespace) -> int:
    return _safely(lambda: _print_image(_open(args).import_path(args.path, args.name,
                                                                 _progress)))


def _rm(args: argparse.Namespace) -> int:
    def run() -> None:
        store = _open(args)
        image = store.get(args.name)
        store.remove(image.name)
        print(f"removed {image.name} ({short(image.digest)}); "
              "`sealgate image gc` frees its layers")
    return _safely(run)


def _gc(args: argparse.Namespace) -> int:
    def run() -> None:
        removed = _open(args).gc()
        if args.json:
            print(json.dumps(removed))
        else:
            for path in removed:
                print(f"removed {path}")
            print(f"{len(removed)} removed")
    return _safely(run)


def _ls(args: argparse.Namespace) -> int:
    def run() -> None:
        images = _open(args).list()
        if args.json:
            print(json.dumps([i.to_json() for i in images], indent=1))
            return
        print(table(images, time.time()), end="")
    return _safely(run)


def table(images: list[Image], now: float) -> str:
    """The `ls` table: name, digest (short), size, layers, age, owner."""
    rows = [("NAME", "DIGEST", "SIZE", "LAYERS", "AGE", "OWNER")]
    rows += [(i.name, short(i.digest), human(i.size), str(len(i.layers)),
              age(now - i.created), i.owner or "-") for i in images]
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return "".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                   .rstrip() + "\n" for row in rows)


def age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(int(seconds), 0)}s"


def _print_image(image: Image) -> None:
    print(f"{image.name} {image.digest}")


def _safely(run: Callable[[], object]) -> int:
    """Run `run()`; an ImageError (or an OS error) is one line on stderr and status 1."""
    try:
        run()
    except ImageError as exc:
        print(f"sealgate image: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"sealgate image: {exc.strerror or exc}"
              + (f": {exc.filename}" if exc.filename else ""), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("sealgate image: interrupted", file=sys.stderr)
        return 130
    return 0
