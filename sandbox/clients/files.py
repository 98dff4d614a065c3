"""`sb.files`: the workspace's files beyond `sb.write` and `sb.read`, in the shape E2B's users
know (`list`, `stat`, `exists`, `mkdir`, `remove`, `rename`, `read`, `write`, `upload_dir`,
`download_dir`, `watch`). Every path is from /workspace ("" or "/" is the workspace itself);
each call is done inside the sandbox as its uid, never through a link.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from types import TracebackType
from typing import IO, Any, Protocol

from sealgate.reasons import Reason

from .clientshared import DEFAULT, CallLimit, DaemonError
from .fsshared import SPOOL, Entry, WatchEvent, clean, json_object, pack, route, unpack


class _Sandbox(Protocol):
    """What of `client.Sandbox` the files use (that module imports this one)."""

    id: str
    client: Any  # client.Client

    def read(self, path: str, *, call_timeout: CallLimit = DEFAULT) -> bytes: ...

    def write(self, path: str, data: bytes, *, mode: int = 0o644,
              call_timeout: CallLimit = DEFAULT) -> int: ...


class Files:
    def __init__(self, sandbox: _Sandbox) -> None:
        self._sb = sandbox

    def _call(self, method: str, tail: str, body: dict[str, Any] | None = None,
              call_timeout: CallLimit = DEFAULT, **query: Any) -> dict[str, Any]:
        answer: dict[str, Any] = self._sb.client.call(
            method, route(self._sb.id, tail, **query), body, call_timeout=call_timeout)
        return answer

    def list(self, path: str = "", *, call_timeout: CallLimit = DEFAULT) -> list[Entry]:
        """The entries of a directory, by name."""
        answer = self._call("GET", "/fs/list", call_timeout=call_timeout, path=clean(path))
        return [Entry.of(raw) for raw in answer.get("entries", [])]

    def stat(self, path: str, *, call_timeout: CallLimit = DEFAULT) -> Entry:
        return Entry.of(self._call("GET", "/fs/stat", call_timeout=call_timeout,
                                   path=clean(path)))

    def exists(self, path: str, *, call_timeout: CallLimit = DEFAULT) -> bool:
        try:
            self.stat(path, call_timeout=call_timeout)
        except DaemonError as exc:
            if exc.reason is Reason.NO_SUCH_FILE:
                return False
            raise
        return True

    def mkdir(self, path: str, *, parents: bool = False, mode: int = 0o755,
              call_timeout: CallLimit = DEFAULT) -> bool:
        """Make a directory; False when `parents` and it was already there (file_exists
        without `parents`)."""
        answer = self._call("POST", "/fs/mkdir", {"path": clean(path), "mode": f"{mode:o}",
                                                  "parents": parents}, call_timeout)
        return bool(answer.get("created"))

    def remove(self, path: str, *, recursive: bool = False,
               call_timeout: CallLimit = DEFAULT) -> None:
        """Remove a file, link or empty directory (a whole tree with `recursive`)."""
        self._call("DELETE", "/fs", call_timeout=call_timeout, path=clean(path),
                   recursive=recursive)

    def rename(self, source: str, target: str, *, call_timeout: CallLimit = DEFAULT) -> None:
        self._call("POST", "/fs/rename", {"from": clean(source), "to": clean(target)},
                   call_timeout)

    def read(self, path: str, *, call_timeout: CallLimit = DEFAULT) -> bytes:
        return self._sb.read(path, call_timeout=call_timeout)

    def write(self, path: str, data: bytes, *, mode: int = 0o644,
              call_timeout: CallLimit = DEFAULT) -> int:
        return self._sb.write(path, data, mode=mode, call_timeout=call_timeout)

    def upload_tar(self, data: bytes | IO[bytes], path: str = "", *,
                   call_timeout: CallLimit = DEFAULT) -> dict[str, Any]:
        """A tar (or gzipped tar) unpacked into the directory `path`, all or nothing:
        `bad_archive` names the member refused, and then nothing was changed."""
        if not isinstance(data, bytes):
            data.seek(0, os.SEEK_END)
            size = data.tell()
            data.seek(0)
        with self._sb.client.open(
                "PUT", route(self._sb.id, "/tar", path=clean(path)), data,
                headers={"Content-Type": "application/x-tar",
                         **({} if isinstance(data, bytes) else {"Content-Length": str(size)})},
                call_timeout=call_timeout) as answer:
            return json_object(answer.read())

    def upload_dir(self, local: str | os.PathLike[str], path: str = "", *,
                   call_timeout: CallLimit = DEFAULT) -> dict[str, Any]:
        """The local directory's content into the directory `path` of the workspace."""
        with pack(local) as archive:
            return self.upload_tar(archive, path, call_timeout=call_timeout)

    def download_tar(self, path: str = "", *, call_timeout: CallLimit = DEFAULT) -> bytes:
        """The directory `path` as a tar stream (its files, directories and links)."""
        with self._sb.client.open("GET", route(self._sb.id, "/tar", path=clean(path)),
                                  call_timeout=call_timeout) as answer:
            data: bytes = answer.read()
        return data

    def download_dir(self, path: str, local: str | os.PathLike[str], *,
                     call_timeout: CallLimit = DEFAULT) -> None:
        """The directory `path` into the local directory `local`, unpacked as hostile input
        (`fsshared.unpack`)."""
        with tempfile.SpooledTemporaryFile(SPOOL) as spool, self._sb.client.open(
                "GET", route(self._sb.id, "/tar", path=clean(path)),
                call_timeout=call_timeout) as answer:
            for chunk in answer.chunks():
                spool.write(chunk)
            spool.seek(0)
            unpack(spool, local)

    def watch(self, path: str = "", *, recursive: bool = True,
              call_timeout: CallLimit = None) -> Watch:
        """The changes under the directory `path` as they happen, once its watch is in place
        (`Watch`: iterate it for `WatchEvent`s, close it to end the watch)."""
        answer = self._sb.client.open(
            "GET", route(self._sb.id, "/watch", path=clean(path), recursive=recursive),
            call_timeout=call_timeout)
        return Watch(answer)


class Watch:
    """A watch in place: iterate for its events (`WatchEvent`); `close()` (or leaving its
    `with`) ends it in the sandbox too."""

    def __init__(self, answer: Any) -> None:  # client.Answer
        self._answer = answer
        self._closed = False
        self._lines = answer.lines()
        try:  # its first line says the watch is in place, and on how many directories
            first = json_object(next(self._lines, b"null"))
            if first.get("event") != "watching":
                raise DaemonError("the watch did not start", reason=Reason.INTERNAL_ERROR,
                                  status=200)
        except BaseException:
            self.close()
            raise
        self.directories = int(first.get("directories", 0))

    def __iter__(self) -> Iterator[WatchEvent]:
        try:
            for line in self._lines:
                yield WatchEvent.of(line)
        except (AttributeError, ValueError, DaemonError):
            # http.client, its connection closed under a read (`close` from another thread),
            # fails as it finds it gone: the end of the watch that was asked for, not an error.
            if not self._closed:
                raise

    def close(self) -> None:
        self._closed = True
        self._answer.__exit__(None, None, None)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

