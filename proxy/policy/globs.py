"""Whether every path one set of path globs matches is matched by another, and if not, a path
that shows it: what `rules bound` needs to say a rule's paths stay inside a ceiling's.

A glob (model.path_glob_regex) is a sequence of literal characters, `*` (any characters but
'/') and `**` (nothing, or '/' and anything). Each is a small automaton; the product of one
glob's and a union of others' is walked breadth first, so the answer is exact, not sampled,
and the path it gives is the shortest one the first matches and the rest do not. Characters
that no glob names are one class (any one of them stands for all), so the walk is over the
handful of characters the globs mention, '/', and that class.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Final

from .model import PathError, normalize_path

_STAR: Final = "*"
_DOUBLE: Final = "**"
# Stand-ins for the class of characters no glob names: the first that none names.
_STAND_INS: Final = "abcdefghijklmnopqrstuvwxyz0123456789-_~"
# A state: (glob, position in its items, inside a `**` after its '/').
_State = tuple[int, int, bool]


def _items(glob: str) -> list[str]:
    """The glob as items: one character, `*` or `**` each."""
    items: list[str] = []
    for segment in glob[1:].split("/"):
        if segment == _DOUBLE:
            items.append(_DOUBLE)  # it brings its own '/'
            continue
        items.append("/")
        items += [_STAR if c == _STAR else c for c in segment]
    return items


class _Union:
    """A nondeterministic automaton for a union of globs."""

    def __init__(self, globs: Sequence[str]) -> None:
        self.globs = [_items(g) for g in globs]

    def start(self) -> frozenset[_State]:
        return self._closure((g, 0, False) for g in range(len(self.globs)))

    def accepts(self, states: frozenset[_State]) -> bool:
        return any(pos == len(self.globs[g]) and not inside for g, pos, inside in states)

    def step(self, states: frozenset[_State], char: str) -> frozenset[_State]:
        moved: list[_State] = []
        for g, pos, inside in states:
            items = self.globs[g]
            if inside:
                moved.append((g, pos, True))  # `**` takes any character, '/' too
                continue
            if pos == len(items):
                continue
            item = items[pos]
            if item == _STAR:
                if char != "/":
                    moved.append((g, pos, False))
            elif item == _DOUBLE:
                if char == "/":
                    moved.append((g, pos, True))
            elif item == char:
                moved.append((g, pos + 1, False))
        return self._closure(moved)

    def _closure(self, states: Iterable[_State]) -> frozenset[_State]:
        todo = list(states)
        done: set[_State] = set()
        while todo:  # each step moves right within a finite list: bounded
            state = todo.pop()
            if state in done:
                continue
            done.add(state)
            g, pos, inside = state
            items = self.globs[g]
            if inside:
                todo.append((g, pos + 1, False))  # the `**` may end here
            elif pos < len(items) and items[pos] in (_STAR, _DOUBLE):
                todo.append((g, pos + 1, False))  # it may match nothing
        # A state "inside" whose `**` ended is its position + 1, already added.
        return frozenset(done)


def uncovered(inner: Sequence[str], outer: Sequence[str]) -> str | None:
    """A request path some glob of `inner` matches and no glob of `outer` does, or None when
    `outer` covers `inner` (only valid request paths count: normalize_path's)."""
    literals = {c for g in (*inner, *outer) for c in g if c not in "*/"}
    other = [c for c in _STAND_INS if c not in literals][:1]
    alphabet = [*sorted(literals), "/", *other]
    a, b = _Union(inner), _Union(outer)
    start: _Triple = (a.start(), b.start(), _START)
    parent: dict[_Triple, tuple[_Triple, str]] = {}
    queue = deque([start])
    seen = {start}
    while queue:  # the product has finitely many states, each visited once
        state = queue.popleft()
        if a.accepts(state[0]) and not b.accepts(state[1]) and state[2] in _ENDS:
            path = _spell(parent, state, start)
            try:
                normalize_path(path)
                return path
            except PathError:
                pass  # refused for what the walk does not follow (percent-escapes): on
        for char in alphabet:
            segment = _segment(state[2], char)
            nxt = (a.step(state[0], char), b.step(state[1], char), segment)
            if nxt[0] and segment != _BAD and nxt not in seen:
                seen.add(nxt)
                parent[nxt] = (state, char)
                queue.append(nxt)
    return None


# Where a path being spelt is, for the two refusals of normalize_path a walk meets: an empty
# segment ('//') and a dot segment ('.', '..'). Followed in the walk, not checked after it: the
# shortest way into a state may be a refused path when a longer one is not.
_START, _EMPTY, _DOTS, _WORD, _BAD = range(5)
_ENDS: Final = (_EMPTY, _WORD)  # a path may end after '/' (the root, '/a/') or in a segment
_Triple = tuple[frozenset[_State], frozenset[_State], int]


def _segment(at: int, char: str) -> int:
    if at == _START:
        return _EMPTY if char == "/" else _BAD
    if char == "/":
        return _EMPTY if at == _WORD else _BAD
    if char == "." and at in (_EMPTY, _DOTS):
        return _DOTS
    return _WORD


def _spell(parent: dict[_Triple, tuple[_Triple, str]], state: _Triple, start: _Triple) -> str:
    chars: list[str] = []
    while state != start:
        state, char = parent[state]
        chars.append(char)
    return "".join(reversed(chars))
