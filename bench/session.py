"""One run of a benchmark script: its options, the lifetime of what it starts, what it was."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from services import ROOT, BenchError, Setup, can_pin, tools

# SIGINT too: a shell starts background jobs with it ignored, and Ctrl-C must still stop us.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_INTERRUPTED, EXIT_FAILED, EXIT_NO_TOOLS = 130, 1, 2


@dataclass(frozen=True)
class Options:
    rounds: int
    seconds: int  # per measurement
    quick: bool
    mode: str  # "full", "quick" or "custom"
    docs: Path  # where the document and its chart go


def parse_options(
    description: str | None, argv: list[str] | None, *, full: tuple[int, int],
    quick: tuple[int, int], quick_takes: str, outputs: str,
) -> Options:
    """--quick, --rounds, --seconds and --docs; `full` and `quick` are (rounds, seconds)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true",
                        help=f"{quick[0]} rounds of {quick[1]} s (about {quick_takes})")
    parser.add_argument("--rounds", type=int, help=f"rounds (default {full[0]}, quick {quick[0]})")
    parser.add_argument("--seconds", type=int, help=f"seconds per measurement (default "
                                                    f"{full[1]}, quick {quick[1]})")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs",
                        help=f"where {outputs} go (default docs/)")
    args = parser.parse_args(argv)
    rounds, seconds = quick if args.quick else full
    custom = args.rounds is not None or args.seconds is not None
    # `is None`, not `or`: an explicit 0 is an error, not a request for the default.
    rounds = rounds if args.rounds is None else args.rounds
    seconds = seconds if args.seconds is None else args.seconds
    if rounds < 1 or seconds < 1:
        parser.error("--rounds and --seconds must be at least 1")
    mode = "custom" if custom else "quick" if args.quick else "full"
    return Options(rounds, seconds, args.quick, mode, args.docs)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@dataclass
class Session:
    setup: Setup
    paths: dict[str, str]  # tool -> its path
    started: float  # time.monotonic() at the start


@contextlib.contextmanager
def bench_session(script: str, needs: Sequence[str]) -> Iterator[Session]:
    """The tools `needs` found, and a `Setup` in a fresh work directory, torn down on the way
    out whatever happened.

    A missing tool ends the program with status 2 before anything starts. SIGINT, SIGTERM and
    SIGHUP interrupt the block; then, or when it ends, every service and the stub DNS server
    are stopped, with those signals ignored so that a second Ctrl-C cannot cut the clean-up
    short and leave proxies running. The work directory and its logs are kept only when the
    block failed. An interrupt ends the program with status 130, a BenchError with its message
    and status 1.
    """
    try:
        paths = tools(*needs)
    except BenchError as exc:
        print(f"{script}: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_NO_TOOLS) from None
    pin = can_pin(script)
    started = time.monotonic()
    for sig in _STOP_SIGNALS:
        signal.signal(sig, _interrupt)
    work = Path(tempfile.mkdtemp(prefix=f"sealgate-{script}-"))
    setup = Setup(work, pin)
    keep_logs = True
    try:
        yield Session(setup, paths, started)
        keep_logs = False
    except KeyboardInterrupt:
        keep_logs = False
        print(f"\n{script}: interrupted; stopping everything", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None
    except BenchError as exc:
        print(f"\n{script}: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_FAILED) from None
    finally:
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        setup.services.stop_all()
        if setup.dns is not None:
            setup.dns.stop()
        if keep_logs:
            print(f"{script}: logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)


def run_meta(
    script: str, argv: list[str] | None, options: Options, started: float
) -> dict[str, str]:
    """How to repeat the run, when it was and how long it took (since `started`, monotonic)."""
    executable = Path(sys.executable)
    with contextlib.suppress(ValueError):
        executable = executable.relative_to(ROOT)
    path = Path(script).resolve().relative_to(ROOT)
    return {
        "command": shlex.join([str(executable), str(path), *(argv or sys.argv[1:])]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "mode": options.mode,
        "rounds": str(options.rounds),
        "seconds": str(options.seconds),
        "duration": f"{(time.monotonic() - started) / 60:.1f} min",
    }
