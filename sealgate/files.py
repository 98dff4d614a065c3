"""Reading the files operators hand us (rules, key files, callers, secrets): regular files only,
size-capped.

A FIFO or a device put where a config file belongs would block `open` and `read` forever, on the
event loop or at start-up; opening without blocking and checking the opened descriptor refuses it
at once. Symlinks are followed (Kubernetes mounts ConfigMaps and Secrets through them).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def read_regular(path: Path, limit: int) -> tuple[bytes, os.stat_result]:
    """Up to `limit` + 1 bytes of `path` (one more than allowed, so the caller can tell the file
    is too large) and the fstat of what was read. Raises OSError; one that is not a regular
    file has strerror "not a regular file"."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), st
    finally:
        os.close(fd)
