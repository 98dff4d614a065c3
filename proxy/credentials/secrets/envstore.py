"""`env:` - secrets from the proxy's own environment, for containers.

`env:PREFIX` confines references to variables starting with PREFIX (`env:SEALGATE_`
makes `env:GITHUB` read SEALGATE_GITHUB), so a rule cannot name, say, the proxy's own
Vault token variable.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping

from sealgate.credentials.errors import SecretConfigError, SecretNotFound
from sealgate.credentials.secretref import SecretRef

from .base import Secret

_PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class EnvStore:
    scheme = "env"

    def __init__(self, prefix: str = "", environ: Mapping[str, str] | None = None) -> None:
        if prefix and not _PREFIX.fullmatch(prefix):
            raise SecretConfigError(f"env store prefix {prefix!r} is not a variable-name prefix")
        self.prefix = prefix
        self._environ = os.environ if environ is None else environ

    async def fetch(self, ref: SecretRef) -> tuple[Secret, float]:
        if ref.store != self.scheme:
            raise SecretConfigError(f"{ref} is not an env secret reference")
        name = self.prefix + ref.path
        value = self._environ.get(name)
        if value is None:
            raise SecretNotFound(f"environment variable {name} is not set")
        # The environment of a running process does not change under it.
        return Secret(value), math.inf

    async def close(self) -> None:
        return None
