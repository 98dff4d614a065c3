"""What the API (`api`) serves: a backend of sandboxes. The daemon on this host (`daemon`, its
slots on namespaces, cgroups and a tier) is one; the Kubernetes backend
(`sandbox.kubernetes.backend`, Agent Sandbox claims) is the other. The API server stands apart
from the machine, so a harness's code is the same against either.

A backend that cannot do something (a pod has no memory snapshot to fork) raises SessionError
with `Reason.UNSUPPORTED` (501), saying why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ..images import Image
from .session import Options, Session


class Backend(Protocol):
    @property
    def sessions(self) -> Mapping[str, Session[Any]]: ...
    @property
    def isolation(self) -> str:
        """What confines its sandboxes: a tier's name, or "kubernetes"."""
    @property
    def max_ttl(self) -> float: ...
    def status(self) -> dict[str, Any]:
        """`ready` (bool) and `problem` (str or None) at least: /v1/health's answer."""
    async def create(self, options: Options, key: str | None = None) -> Session[Any]: ...
    def get(self, ident: str) -> Session[Any]: ...
    async def update(self, ident: str, *, ttl: float | None = None,
                     idle_timeout: float | None = None,
                     metadata: Mapping[str, str] | None = None,
                     sandbox: str | None = None) -> Session[Any]: ...
    async def delete(self, ident: str, why: str = "deleted") -> None: ...
    async def snapshot(self, ident: str, name: str | None) -> Image: ...
    async def fork(self, ident: str, n: int) -> list[Session[Any]]: ...
