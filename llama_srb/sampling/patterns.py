"""Banned patterns (`banned_regex`): RE2 does every match, so the time a pattern costs is
linear in the text it reads, whatever the pattern (`(a+)+$` included).

A streamed branch must hold back whatever could still grow into a match, which needs more
than RE2 answers (it finds matches; it cannot say whether text is the start of one). So
each pattern is parsed once (Python's `re._parser`: its parser only, never its
backtracking matcher) into a canonical RE2 form and a second RE2 pattern for its
*prefixes*: pref(R) matches exactly the strings that can begin a match of R. One RE2
search of `(?:pref…)\\z` then gives the earliest place in the held text from which a match
could still come. Both RE2 patterns are built from the same parse, so they agree.

A match is only taken as one when no text to come can undo it: its last assertion (`\\b`,
`$`) may depend on the next character, so it is looked for twice, with a word character
and with a non-word one after the text; until both find it, it is held, not banned.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from llama_srb.sampling.errors import ParamError

try:  # Python 3.11+: the parser is private; sre_parse is its deprecated alias
    import re._constants as C  # type: ignore[import-not-found,unused-ignore]
    import re._parser as P  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover
    import sre_constants as C  # type: ignore[no-redef,unused-ignore]
    import sre_parse as P  # type: ignore[no-redef,unused-ignore]

# Bounds: every branch searches its held text with all of a request's patterns on each
# token, and a pattern's prefix form is a few times its size.
MAX_BANNED_REGEX = 128
MAX_REGEX_CHARS = 256
# A pattern that can stay open for long (`\bher \w+ \w+ white`, or `.*`) holds a stream
# back at most this many characters: text further back goes out, so a match longer than
# this may be written. Per token a branch reads about this much text per search.
MAX_HOLD_CHARS = 256
_MAX_MEM = 16 << 20  # RE2's budget per compiled set (program, then DFA cache); 2 per list

_FLAGS = ((re.IGNORECASE, "i"), (re.MULTILINE, "m"), (re.DOTALL, "s"))
_IGNORED_FLAGS = re.UNICODE | re.VERBOSE | re.ASCII  # parse-time only, or RE2's anyway
_AT = {
    C.AT_BEGINNING: "^",
    C.AT_BEGINNING_STRING: r"\A",
    C.AT_END: "$",
    C.AT_END_STRING: r"\z",
    C.AT_BOUNDARY: r"\b",
    C.AT_NON_BOUNDARY: r"\B",
}
_CATEGORY = {
    C.CATEGORY_DIGIT: r"\d",
    C.CATEGORY_NOT_DIGIT: r"\D",
    C.CATEGORY_SPACE: r"\s",
    C.CATEGORY_NOT_SPACE: r"\S",
    C.CATEGORY_WORD: r"\w",
    C.CATEGORY_NOT_WORD: r"\W",
}
_ONE_CHAR = (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN)


class _Unsupported(Exception):
    pass


def _python_spelling(pattern: str) -> str:
    """RE2's `\\z` (end of text) is `\\Z` to Python's parser (RE2 has no `\\Z`)."""
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] == "\\" and i + 1 < len(pattern):
            escape = pattern[i : i + 2]
            out.append("\\Z" if escape == "\\z" else escape)
            i += 2
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


# What the server's process holds when a first pattern comes: llama.cpp's libraries, then
# google-re2's binding.
PROBE = "import llama_cpp, re2"


@functools.cache
def _binding_or_reason() -> ModuleType | str:
    """google-re2's binding, or why it is not loaded. It is imported at the first pattern,
    and only once a child process has loaded it beside llama.cpp: on a CUDA build of
    llama.cpp (CUDA 13, 2026-12-04) the two crashed one process, in either order. So a
    server never asked for a pattern never loads it, and where the child fails, patterns
    get a 400 instead of crashing the server."""
    try:
        child = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, timeout=120)
        fails = child.returncode != 0
    except subprocess.TimeoutExpired:
        fails = True
    if fails:
        return (
            "banned_regex is unavailable on this server: google-re2 does not load beside"
            " this build of llama.cpp (a process holding both failed); use banned_strings"
        )
    from re2 import _re2

    return _re2


def _binding() -> Any:  # the binding is untyped
    binding = _binding_or_reason()
    if isinstance(binding, str):
        raise ValueError(binding)
    return binding


def _options() -> Any:
    options = _binding().RE2.Options()
    options.log_errors = False
    options.max_mem = _MAX_MEM
    options.never_capture = True
    return options


def _char(code: int) -> str:
    c = chr(code)
    return c if c.isascii() and c.isalnum() else f"\\x{{{code:x}}}"


def _flags(bits: int) -> str:
    if bits & ~(_IGNORED_FLAGS | re.IGNORECASE | re.MULTILINE | re.DOTALL):
        raise _Unsupported("a flag RE2 does not have")
    return "".join(letter for flag, letter in _FLAGS if bits & flag)


def _class(items: list[tuple[Any, Any]]) -> str:
    out = []
    negate = ""
    for op, av in items:
        if op is C.NEGATE:
            negate = "^"
        elif op is C.LITERAL:
            out.append(_char(av))
        elif op is C.RANGE:
            out.append(f"{_char(av[0])}-{_char(av[1])}")
        elif op is C.CATEGORY and av in _CATEGORY:
            out.append(_CATEGORY[av])
        else:
            raise _Unsupported(f"{op} in a character class")
    return f"[{negate}{''.join(out)}]"


def _quantifier(lo: int, hi: int) -> str:
    if hi is C.MAXREPEAT or hi == C.MAXREPEAT:
        return {0: "*", 1: "+"}.get(lo, f"{{{lo},}}")
    if lo == hi:
        return f"{{{lo}}}"
    return "?" if (lo, hi) == (0, 1) else f"{{{lo},{hi}}}"


def _node(op: Any, av: Any) -> str:
    """One parsed node as RE2 syntax (captures dropped: only where a match is counts)."""
    if op is C.LITERAL:
        return _char(av)
    if op is C.NOT_LITERAL:
        return f"[^{_char(av)}]"
    if op is C.ANY:
        return "."
    if op is C.IN:
        return _class(av)
    if op is C.AT and av in _AT:
        return _AT[av]
    if op is C.BRANCH:
        return "(?:" + "|".join(_seq(b) for b in av[1]) + ")"
    if op is C.SUBPATTERN:
        _group, add, remove, body = av
        return _group_with_flags(add, remove, _seq(body))
    if op in (C.MAX_REPEAT, C.MIN_REPEAT):
        lo, hi, body = av
        lazy = "?" if op is C.MIN_REPEAT else ""
        return f"(?:{_seq(body)}){_quantifier(lo, hi)}{lazy}"
    raise _Unsupported(str(op).lower().replace("_", " "))


def _seq(nodes: Any) -> str:
    return "".join(_node(op, av) for op, av in nodes)


def _group_with_flags(add: int, remove: int, body: str) -> str:
    on, off = _flags(add), _flags(remove)
    if not on and not off:
        return f"(?:{body})"
    return f"(?{on}{'-' + off if off else ''}:{body})"


def _pref_node(op: Any, av: Any) -> str:
    """A pattern for the prefixes of the node's matches (the empty one included)."""
    if op in _ONE_CHAR or op is C.AT:
        return f"(?:{_node(op, av)})?" if op is not C.AT else f"(?:|{_node(op, av)})"
    if op is C.BRANCH:
        return "(?:" + "|".join(_pref_seq(b) for b in av[1]) + ")"
    if op is C.SUBPATTERN:
        _group, add, remove, body = av
        return _group_with_flags(add, remove, _pref_seq(body))
    if op in (C.MAX_REPEAT, C.MIN_REPEAT):
        _lo, hi, body = av
        if hi == 0:
            return ""
        # a prefix of R{lo,hi}: up to hi-1 whole R, then a prefix of one more
        unbounded = hi is C.MAXREPEAT or hi == C.MAXREPEAT
        whole = "" if hi == 1 else f"(?:{_seq(body)}){_quantifier(0, hi if unbounded else hi - 1)}"
        return f"(?:{whole}{_pref_seq(body)})"
    raise _Unsupported(str(op).lower().replace("_", " "))


def _pref_seq(nodes: Any) -> str:
    """pref(n1 n2 … nk) = pref(n1) | n1 pref(n2 … nk), built from the end (nested, so the
    size stays about twice the pattern's per level of nesting)."""
    acc = ""
    for op, av in reversed(list(nodes)):
        if not acc:
            acc = _pref_node(op, av)
        elif op in _ONE_CHAR or op is C.AT:
            acc = f"(?:|{_node(op, av)}{acc})"
        else:
            acc = f"(?:{_pref_node(op, av)}|{_node(op, av)}{acc})"
    return acc


@dataclass(frozen=True)
class _Canonical:
    match: str  # the pattern in RE2 syntax
    prefixes: str  # the RE2 pattern for the prefixes of its matches


@functools.lru_cache(maxsize=4096)
def canonical(pattern: str) -> _Canonical:
    """The pattern's RE2 forms; raises ValueError saying why the pattern cannot be taken."""
    _re2(pattern)  # RE2's own verdict first: its messages are the ones a writer can look up
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. `[[:alpha:]]`, read otherwise by each
            parsed = P.parse(_python_spelling(pattern))
        flags = _flags(parsed.state.flags)
        body, prefixes = _seq(parsed), _pref_seq(parsed)
    except (re.error, FutureWarning, DeprecationWarning, _Unsupported) as exc:
        raise ValueError(f"cannot be analysed for streaming ({exc})") from None
    if flags:
        body, prefixes = f"(?{flags}:{body})", f"(?{flags}:{prefixes})"
    for form in (body, prefixes):
        try:
            _re2(form)
        except ValueError as exc:
            raise ValueError(f"too large once analysed ({exc})") from None
    return _Canonical(body, prefixes)


def _re2(pattern: str) -> Any:
    """RE2 itself (google-re2's binding, without its str wrapper: the text is UTF-8 bytes
    already, and the wrapper's per-call work was most of the cost of a search)."""
    regexp = _binding().RE2(pattern.encode(), _options())
    if not regexp.ok():
        error = regexp.error()
        raise ValueError(error.decode() if isinstance(error, bytes) else str(error))
    return regexp


def check_patterns(name: str, patterns: Sequence[str], case_sensitive: bool) -> None:
    """Raise ParamError naming the first pattern the engine cannot take."""
    try:
        _binding()
    except ValueError as exc:
        raise ParamError(name, str(exc)) from None
    for i, pattern in enumerate(patterns):
        try:
            canonical(pattern)
        except ValueError as exc:
            raise ParamError(name, f"{name}[{i}] {pattern!r}: {exc}") from None
    try:
        compiled(tuple(patterns), case_sensitive)
    except ValueError as exc:
        raise ParamError(name, f"{name}: {exc}") from None


@functools.lru_cache(maxsize=16)  # at most 16 lists, 2 RE2 sets of _MAX_MEM each
def compiled(patterns: tuple[str, ...], case_sensitive: bool) -> PatternSet:
    """The request's patterns as one RE2 set (cached: the same list is sent again and again)."""
    forms = [canonical(p) for p in patterns]
    fold = "" if case_sensitive else "(?i)"
    match = fold + "(?:" + "|".join(f.match for f in forms) + ")"
    prefixes = fold + "(?:" + "|".join(f.prefixes for f in forms) + r")\z"
    try:
        return PatternSet(_re2(match), _re2(prefixes))
    except ValueError as exc:
        raise ValueError(f"the patterns together are too large ({exc})") from None


class PatternSet:
    """A request's patterns, compiled: where matches begin, and where one still could.

    The text given to each method is UTF-8 bytes: one character of the context before
    the held text (for `\\b` at its start), then the held text; offsets are in bytes.
    RE2 reads the bytes around [start, end) for its assertions but matches only inside.
    """

    def __init__(self, match: Any, prefixes: Any) -> None:
        self._match = match
        self._prefixes = prefixes
        self._unanchored = _binding().RE2.Anchor.UNANCHORED

    def _search(self, regexp: Any, text: bytes, start: int, end: int) -> int:
        """The start of the leftmost match in text[start:end], or -1."""
        return int(regexp.Match(self._unanchored, text, start, end)[0][0])

    def certain(self, text: bytes, start: int) -> int | None:
        """The earliest match beginning at or after `start` that no text to come can
        undo (found whether a word character or another follows), or None."""
        end = len(text)
        # a certain match is one where the text ends too (the end reads as a non-word
        # character, and `$` only holds more): most tokens stop at this one search
        if self._search(self._match, text, start, end) < 0:
            return None
        word, other = text + b"a", text + b"\x00"
        pos = start
        for _ in range(8):  # almost always once; after that the match is held, not lost
            a = self._search(self._match, word, pos, end)
            if a < 0:
                return None
            b = self._search(self._match, other, a, end)
            if b < 0:
                return None
            if a == b:
                return a
            pos = b
        return None

    def final(self, text: bytes, start: int) -> int | None:
        """The earliest match beginning at or after `start` when the text ends here."""
        at = self._search(self._match, text, start, len(text))
        return None if at < 0 else at

    def live(self, text: bytes, start: int) -> int:
        """The earliest offset at or after `start` from which text to come could still
        complete a match (len(text) when none)."""
        at = self._search(self._prefixes, text, start, len(text))
        return len(text) if at < 0 else at
