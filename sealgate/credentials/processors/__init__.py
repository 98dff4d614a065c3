"""The injection processors, one type per module, and the one registry of them: type name ->
class (`PROCESSOR_TYPES`), and a processor built from its JSON form (`processor_from_object`).

Adding a processor: its module here (a `Processor` subclass naming its `kind`; `base.py` says
what it must and may do; an `ExchangeProcessor` of `exchange.py` when the proxy obtains what goes
in) and its documentation (docs/rules.md, docs/token-format.md §4). The registry finds it: every
module of this package is read once, at import, for the processor types it defines. The imports
below only give the existing types their short names. Nothing outside this package asks which
processor it has.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Final

from ..errors import InjectionError, ProcessorInvalid, RequestInapplicable, SecretInvalid
from .awssigv4 import AWS_PLACEHOLDER_KEY_ID, AWS_PLACEHOLDER_SECRET, AwsSigV4Processor
from .base import MAX_SECRET_LENGTH, Exchange, Processor, TokenExchange
from .basic import BasicProcessor
from .bearer import BearerProcessor
from .exchange import SCHEMES, ExchangeProcessor
from .gcpserviceaccount import GcpServiceAccountProcessor
from .githubapp import GitHubAppProcessor
from .header import HeaderProcessor
from .hmacsha256 import HmacProcessor
from .oauth2 import OAuth2Processor
from .placeholder import PlaceholderProcessor
from .query import QueryProcessor

__all__ = [
    "AWS_PLACEHOLDER_KEY_ID",
    "AWS_PLACEHOLDER_SECRET",
    "MAX_SECRET_LENGTH",
    "PROCESSOR_TYPES",
    "SCHEMES",
    "AwsSigV4Processor",
    "BasicProcessor",
    "BearerProcessor",
    "Exchange",
    "ExchangeProcessor",
    "GcpServiceAccountProcessor",
    "GitHubAppProcessor",
    "HeaderProcessor",
    "HmacProcessor",
    "InjectionError",
    "OAuth2Processor",
    "PlaceholderProcessor",
    "Processor",
    "ProcessorInvalid",
    "QueryProcessor",
    "RequestInapplicable",
    "SecretInvalid",
    "TokenExchange",
    "processor_from_object",
    "processor_type",
]



def _defined_types() -> list[type[Processor]]:
    """The processor types this package's modules define (a type names its own `kind`; the
    bases in base.py and exchange.py do not), in the order of their kinds."""
    found: dict[str, type[Processor]] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, Processor)
                    and value.__module__ == module.__name__ and "kind" in vars(value)):
                if value.kind in found:  # two types, one name: the JSON form would be ambiguous
                    raise ImportError(f"two processor types named {value.kind!r}")
                found[value.kind] = value
    return [found[kind] for kind in sorted(found)]


PROCESSOR_TYPES: Final[Mapping[str, type[Processor]]] = {
    cls.kind: cls for cls in _defined_types()
}


def processor_type(kind: object) -> type[Processor]:
    """The class registered as `kind`; ProcessorInvalid for anything else."""
    if not isinstance(kind, str):
        raise ProcessorInvalid("processor type must be a string")
    cls = PROCESSOR_TYPES.get(kind)
    if cls is None:
        raise ProcessorInvalid(f"unknown processor type {kind[:40]!r}")
    return cls


def processor_from_object(value: object) -> Processor:
    """Build a processor from its JSON form, e.g. `{"type": "header", "header": "X-Api-Key",
    "format": "{secret}"}`. Unknown types, unknown or missing fields, non-string values and
    settings the processor refuses are ProcessorInvalid."""
    if not isinstance(value, Mapping):
        raise ProcessorInvalid("processor must be an object")
    return processor_type(value.get("type")).from_fields(value)
