"""A step-counting backtracking matcher for the text readers' patterns (issue 58).

Python's `re` is a backtracking engine and says nothing about the work a search does. This
module runs the same parse tree (`re._parser`, the tree `re` compiles) with the same
semantics — greedy, lazy and possessive repeats, atomic groups, alternation in order,
lookarounds, anchors — and counts every step: each character tested, each alternative and
each repeat length tried, each start position of a search. `re`'s engine backtracks exactly
as this one does (its optimisations only skip start positions that cannot match), so a
pattern whose count grows linearly here is linear there: the test compares the counts on
inputs of two lengths, never a wall clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from re import _constants as C  # type: ignore[attr-defined]
from re import _parser  # type: ignore[attr-defined]
from typing import Any

_SINGLE = (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN)


class Budget(Exception):
    """More steps than the caller allowed: the pattern is not linear on this input."""


class Counter:
    def __init__(self, pattern: re.Pattern[str], limit: int) -> None:
        self.tree = _parser.parse(pattern.pattern, pattern.flags)
        self.icase = bool(pattern.flags & re.IGNORECASE)
        self.limit = limit
        self.steps = 0
        self.text = ""

    def step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > self.limit:
            raise Budget(self.steps)

    # ----- one character ----------------------------------------------------------------

    def _char(self, op: Any, av: Any, c: str) -> bool:
        if op is C.LITERAL:
            return c == chr(av) or (self.icase and c.lower() == chr(av).lower())
        if op is C.NOT_LITERAL:
            return not (c == chr(av) or (self.icase and c.lower() == chr(av).lower()))
        if op is C.ANY:
            return c != "\n"
        if op is C.IN:
            return self._in(av, c)
        raise NotImplementedError(op)

    def _in(self, items: Any, c: str) -> bool:
        negate = False
        hit = False
        for op, av in items:
            if op is C.NEGATE:
                negate = True
            elif op is C.LITERAL:
                hit |= c == chr(av) or (self.icase and c.lower() == chr(av).lower())
            elif op is C.RANGE:
                lo, hi = av
                hit |= any(lo <= ord(x) <= hi for x in
                           ((c, c.lower(), c.upper()) if self.icase else (c,)))
            elif op is C.CATEGORY:
                hit |= _category(av, c)
            else:
                raise NotImplementedError(op)
        return hit != negate

    def _single(self, item: Any, pos: int) -> bool:
        """Whether one-character `item` (a sequence of one node) matches at `pos`."""
        self.step()
        if pos >= len(self.text):
            return False
        op, av = item[0]
        return self._char(op, av, self.text[pos])

    # ----- sequences ----------------------------------------------------------------------

    def ends(self, seq: Any, i: int, pos: int) -> Iterator[int]:
        """Every end of a match of seq[i:] from `pos`, in the order `re` tries them."""
        self.step()
        if i == len(seq):
            yield pos
            return
        op, av = seq[i]
        if op in _SINGLE:
            if pos < len(self.text) and self._char(op, av, self.text[pos]):
                yield from self.ends(seq, i + 1, pos + 1)
            return
        if op is C.SUBPATTERN:
            for e in self.ends(av[3], 0, pos):
                yield from self.ends(seq, i + 1, e)
            return
        if op is C.BRANCH:
            for alt in av[1]:
                self.step()
                for e in self.ends(alt, 0, pos):
                    yield from self.ends(seq, i + 1, e)
            return
        if op is C.ATOMIC_GROUP:
            first = next(self.ends(av, 0, pos), None)
            if first is not None:
                yield from self.ends(seq, i + 1, first)
            return
        if op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT):
            yield from self._repeat(op, av, seq, i, pos)
            return
        if op in (C.ASSERT, C.ASSERT_NOT):
            direction, sub = av
            hit = self._look(direction, sub, pos)
            if hit == (op is C.ASSERT):
                yield from self.ends(seq, i + 1, pos)
            return
        if op is C.AT:
            if self._at(av, pos):
                yield from self.ends(seq, i + 1, pos)
            return
        raise NotImplementedError(op)

    def _look(self, direction: int, sub: Any, pos: int) -> bool:
        if direction == 1:
            return next(self.ends(sub, 0, pos), None) is not None
        width = sub.getwidth()[0]
        start = pos - width
        return start >= 0 and any(e == pos for e in self.ends(sub, 0, start))

    def _at(self, code: Any, pos: int) -> bool:
        self.step()
        n = len(self.text)
        if code in (C.AT_BEGINNING, C.AT_BEGINNING_STRING):
            return pos == 0
        if code is C.AT_END:
            return pos == n or (pos == n - 1 and self.text[pos] == "\n")
        if code is C.AT_END_STRING:
            return pos == n
        word = [pos > 0 and _word(self.text[pos - 1]), pos < n and _word(self.text[pos])]
        if code is C.AT_BOUNDARY:
            return word[0] != word[1]
        if code is C.AT_NON_BOUNDARY:
            return word[0] == word[1]
        raise NotImplementedError(code)

    def _repeat(self, op: Any, av: Any, seq: Any, i: int, pos: int) -> Iterator[int]:
        lo, hi, item = av
        single = len(item) == 1 and item[0][0] in _SINGLE
        if single:
            k = 0
            while k < hi and self._single(item, pos + k):
                k += 1
            if k < lo:
                return
            if op is C.POSSESSIVE_REPEAT:
                yield from self.ends(seq, i + 1, pos + k)
            elif op is C.MAX_REPEAT:
                for j in range(k, lo - 1, -1):
                    self.step()
                    yield from self.ends(seq, i + 1, pos + j)
            else:
                for j in range(lo, k + 1):
                    self.step()
                    yield from self.ends(seq, i + 1, pos + j)
            return
        if op is C.POSSESSIVE_REPEAT:
            end, count = pos, 0
            while count < hi:
                e = next(self.ends(item, 0, end), None)
                if e is None or e == end:
                    break
                end, count = e, count + 1
            if count >= lo:
                yield from self.ends(seq, i + 1, end)
            return
        yield from self._general(op is C.MAX_REPEAT, lo, hi, item, seq, i, pos, 0)

    def _general(self, greedy: bool, lo: int, hi: int, item: Any, seq: Any, i: int,
                 pos: int, count: int) -> Iterator[int]:
        """A repeat of a sub-pattern, one more iteration first (greedy) or last (lazy)."""
        self.step()
        if not greedy and count >= lo:
            yield from self.ends(seq, i + 1, pos)
        if count < hi:
            for e in self.ends(item, 0, pos):
                if e != pos:
                    yield from self._general(greedy, lo, hi, item, seq, i, e, count + 1)
        if greedy and count >= lo:
            yield from self.ends(seq, i + 1, pos)


def _word(c: str) -> bool:
    return c.isalnum() or c == "_"


def _category(code: Any, c: str) -> bool:
    table = {C.CATEGORY_DIGIT: c.isdecimal(), C.CATEGORY_NOT_DIGIT: not c.isdecimal(),
             C.CATEGORY_SPACE: c.isspace(), C.CATEGORY_NOT_SPACE: not c.isspace(),
             C.CATEGORY_WORD: _word(c), C.CATEGORY_NOT_WORD: not _word(c)}
    return table[code]


def search_steps(pattern: re.Pattern[str], text: str, limit: int = 10**8) -> tuple[int, int | None]:
    """(steps, start of the first match or None) of `pattern.search(text)`; Budget past
    `limit` steps."""
    counter = Counter(pattern, limit)
    counter.text = text
    for start in range(len(text) + 1):
        counter.step()
        if next(counter.ends(counter.tree, 0, start), None) is not None:
            return counter.steps, start
    return counter.steps, None
