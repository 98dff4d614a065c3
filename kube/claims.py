"""Which pod holds each address, so which sandbox the proxy is told the address is: the pure
part of identity by pod (`podwatch` feeds it the API's events and tells the proxy).

The rule that keeps a reused address from inheriting an identity: **the last pod seen claiming
an address owns it, labelled or not.** Kubernetes reuses pod IPs; the API's events of two pods
arrive in the order the API server wrote them, but a new pod may be given an address before the
event that ends the old pod's claim is written (the CNI releases the address when the old pod's
sandbox is torn down, before its object is removed). So:

- a live pod with an address claims it at once, whatever held it: with the sandbox label it is
  that sandbox's, without it (or with a label that is no sandbox id) it is **no one's**, and
  whatever registration the address had is withdrawn;
- the end of a pod (deleted, terminating: `deletionTimestamp` set, a terminal phase, an
  address dropped) withdraws only the addresses it still owns: a late DELETED of an old pod
  never unregisters the new pod that already holds its address;
- a pod on the host's network never claims anything (its address is its node's);
- a re-list (at start, after 410 Gone) is the truth: what it shows replaces the claims, and an
  address two live pods claim in it is no one's (fail closed).

`Change`s are what the proxy's registry must be told: an address's sandbox, or None for none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import ip_address
from typing import Any

from sealgate.reasons import Reason, SealgateError

# The rules' sandbox ids (proxy/policy): what a label value must look like to be tried at all.
_SANDBOX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_TERMINAL = frozenset({"Succeeded", "Failed"})


class PodError(SealgateError, ValueError):
    """An object in the API's answer that is not a pod we can read (its claims are none)."""

    reason = Reason.BAD_REQUEST


@dataclass(frozen=True)
class Pod:
    uid: str
    addresses: tuple[str, ...]  # what it claims now: empty once it is ending
    sandbox: str | None  # its label's sandbox id; None: no one's

    @classmethod
    def of(cls, raw: Any, label: str) -> Pod:
        """A pod from the API's JSON (list item or watch event object). Raises PodError."""
        if not isinstance(raw, Mapping):
            raise PodError("not an object")
        meta, spec, status = (raw.get(k) or {} for k in ("metadata", "spec", "status"))
        if not all(isinstance(part, Mapping) for part in (meta, spec, status)):
            raise PodError("metadata, spec or status not an object")
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid or len(uid) > 128:
            raise PodError("no uid")
        labels = meta.get("labels") or {}
        value = labels.get(label) if isinstance(labels, Mapping) else None
        sandbox = value if isinstance(value, str) and _SANDBOX_ID.fullmatch(value) else None
        ending = (meta.get("deletionTimestamp") is not None
                  or status.get("phase") in _TERMINAL or spec.get("hostNetwork") is True)
        return cls(uid, () if ending else _addresses(status), sandbox)


def _addresses(status: Mapping[str, Any]) -> tuple[str, ...]:
    """`status.podIPs` (dual-stack: one per family), else `status.podIP`; each one checked."""
    listed = status.get("podIPs")
    raw = [item.get("ip") for item in listed if isinstance(item, Mapping)] \
        if isinstance(listed, list) else [status.get("podIP")]
    found = []
    for value in raw[:4]:
        if not isinstance(value, str) or not value:
            continue
        try:
            found.append(str(ip_address(value)))
        except ValueError:
            raise PodError(f"not an address: {value[:64]!r}") from None
    return tuple(dict.fromkeys(found))


Change = tuple[str, str | None]  # an address, and the sandbox it is now (None: no one's)


class Claims:
    """Each address's owner (a pod's uid) and sandbox, and what the proxy was told."""

    def __init__(self) -> None:
        self._owner: dict[str, tuple[str, str | None]] = {}  # address -> (uid, sandbox)
        self._held: dict[str, set[str]] = {}  # uid -> its addresses

    def sandbox_of(self, address: str) -> str | None:
        owner = self._owner.get(address)
        return None if owner is None else owner[1]

    def registered(self) -> dict[str, str]:
        """Every address that is some sandbox's now."""
        return {a: s for a, (_, s) in self._owner.items() if s is not None}

    def seen(self, pod: Pod) -> list[Change]:
        """An ADDED or MODIFIED pod."""
        before = self.registered()
        held = self._held.setdefault(pod.uid, set())
        for address in held - set(pod.addresses):  # dropped, or the pod is ending
            self._release(pod.uid, address)
        for address in pod.addresses:
            self._owner[address] = (pod.uid, pod.sandbox)
            held.add(address)
        if not held:
            del self._held[pod.uid]
        return _changes(before, self.registered())

    def gone(self, uid: str) -> list[Change]:
        """A DELETED pod: what it still owns, released."""
        before = self.registered()
        for address in list(self._held.get(uid, ())):
            self._release(uid, address)
        self._held.pop(uid, None)
        return _changes(before, self.registered())

    def relist(self, pods: Iterable[Pod]) -> list[Change]:
        """A full list: the claims it shows, and no other."""
        before = self.registered()
        claimants: dict[str, list[Pod]] = {}
        for pod in pods:
            for address in pod.addresses:
                claimants.setdefault(address, []).append(pod)
        self._owner, self._held = {}, {}
        for address, pods_of in claimants.items():
            uids = {p.uid for p in pods_of}
            if len(uids) > 1:  # two live pods on one address: neither is believed
                self._owner[address] = ("", None)
                continue
            pod = pods_of[0]
            self._owner[address] = (pod.uid, pod.sandbox)
            self._held.setdefault(pod.uid, set()).add(address)
        return _changes(before, self.registered())

    def _release(self, uid: str, address: str) -> None:
        # Only what it still owns: a newer claimant's address stays the newer claimant's (the
        # old pod's set keeps naming it until the old pod ends, harmlessly).
        owner = self._owner.get(address)
        if owner is not None and owner[0] == uid:
            del self._owner[address]
        self._held.get(uid, set()).discard(address)


def _changes(before: Mapping[str, str], after: Mapping[str, str]) -> list[Change]:
    gone: list[Change] = [(a, None) for a in before if a not in after]
    return gone + [(a, s) for a, s in after.items() if before.get(a) != s]
