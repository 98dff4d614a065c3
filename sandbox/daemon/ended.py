"""The sandboxes a backend has had: ids that ended and why, remembered (the newest
`ENDED_KEPT`) so that an id is never given twice and a caller asking for an ended sandbox learns
why (`sandbox_ended`) rather than that it never was. Both backends' (`daemon`,
`sandbox.kubernetes.backend`); a daemon hands its list to a successor (`handover`)."""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Container, Mapping
from typing import Any, TypeVar

from sealgate.reasons import Reason

from .carried import ENDED_KEPT
from .session import Session, SessionError

_S = TypeVar("_S", bound=Session[Any])


class Ended:
    def __init__(self) -> None:
        self._why: OrderedDict[str, str] = OrderedDict()

    def remember(self, ident: str, why: str) -> None:
        self._why[ident] = why
        while len(self._why) > ENDED_KEPT:
            self._why.popitem(last=False)

    def items(self) -> dict[str, str]:
        """Oldest first."""
        return dict(self._why)

    def find(self, sessions: Mapping[str, _S], ident: str) -> _S:
        """The live session `ident`. Raises SessionError: ended (and why), or none such."""
        session = sessions.get(ident)
        if session is not None:
            return session
        if (why := self._why.get(ident)) is not None:
            raise SessionError(f"sandbox {ident[:64]} has ended ({why})",
                               reason=Reason.SANDBOX_ENDED)
        raise SessionError(f"no sandbox {ident[:64]!r}", reason=Reason.NO_SUCH_SANDBOX)

    def new_id(self, live: Container[str]) -> str:
        """An id neither live nor remembered (a claim's name too, on Kubernetes: lower-case
        hex keeps it a valid object name)."""
        for _ in range(8):  # 64 random bits: a second try is already next to impossible
            ident = "sb-" + secrets.token_hex(8)
            if ident not in live and ident not in self._why:
                return ident
        raise SessionError("no unused sandbox id", reason=Reason.SANDBOX_FAILED)
