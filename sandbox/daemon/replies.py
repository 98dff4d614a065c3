"""What a sandbox's agent and shims say back, read as the sandbox's word: a status line that
may be missing or malformed (a workload may kill its shim), and a file error's reason."""

from __future__ import annotations

import json
from typing import Any

from sealgate.reasons import Reason

from ..guest.protocol import Ending

__all__ = ["file_reason", "status"]


def file_reason(answer: dict[str, Any]) -> Reason:
    """The reason a file op's error is refused with, from the shim's words."""
    error = str(answer.get("error", ""))
    if answer.get("too_large") or "No space left" in error:  # over the scratch's cap
        return Reason.TOO_LARGE
    if "No such file" in error or "Not a directory" in error or "not a regular file" in error:
        return Reason.NO_SUCH_FILE
    if "symbolic link" in error or "Too many levels" in error or "inside the workspace" in error:
        return Reason.BAD_PATH
    return Reason.BAD_REQUEST


def status(raw: bytes) -> dict[str, Any]:
    """The shim's status line, or what stands for it when there is none (it was killed by the
    workload, or the sandbox ended): never a guess at an exit code."""
    try:
        answer = json.loads(raw.split(b"\n", 1)[0])
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return {"exit": None, "ending": Ending.LOST,
                "error": "the command's supervisor in the sandbox ended without a status"}
    return answer
