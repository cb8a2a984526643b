"""llama.cpp's GBNF → an llguidance Lark grammar that accepts exactly the same text.

GBNF is a context-free grammar over characters; llguidance splits a grammar into lexemes
(matched greedily by its lexer) and rules over them. Greedy lexemes change the language
(`root ::= ident "x"` with `ident ::= [a-z]*` would never end `abx`: the lexer eats the
`x`), so every GBNF character, class and `.` becomes a lexeme of one character: a set of
single characters is prefix-free, so the lexer never has a choice to make and the Lark
grammar means what the GBNF meant. Groups become rules of their own (Lark nests 30 deep,
GBNF as deep as the grammar limits allow) and token references (`<[id]>`, `<text>`,
`!<...>`) llguidance's token sets, never matching an end-of-generation token, as llama.cpp's
grammar lets those end a complete grammar only.

The parser follows llama.cpp's (src/llama-grammar.cpp, `llama_grammar_parser`): its
names, escapes, spacing and newline rules, repetition rewrites and error messages; a
grammar it rejects is rejected here with its reason. Unlike llama.cpp it runs in linear
time without recursion. One difference: left recursion, which llama.cpp refuses, is
accepted (an Earley parser handles it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from llama_srb.sampling.errors import ParamError

# llama.cpp's MAX_REPETITION_THRESHOLD: a larger minimum is an error, a larger maximum
# means no maximum.
MAX_REPETITION = 2000
_MAX_CODEPOINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)
_EXCERPT = 40


class GbnfError(Exception):
    """Why the grammar does not parse, in llama.cpp's words where it has them."""


def gbnf_to_lark(
    text: str,
    token_for: Callable[[str], int | None],
    n_vocab: int,
    eog_tokens: Sequence[int],
    param: str = "grammar",
) -> str:
    """The Lark grammar for GBNF `text`; ParamError(param) with the parser's reason.
    `token_for("<text>")` is the one token `<text>` spells (parse_special), or None."""
    try:
        rules = _Parser(text, token_for, n_vocab).parse()
    except GbnfError as exc:
        raise ParamError(param, f"the grammar could not be parsed: {exc}") from None
    return _render(rules, eog_tokens)


# -- the grammar as parsed: rules of alternatives of items ----------------------------


@dataclass
class _Chars:
    """One character from a class: (low, high) code point ranges, or their complement."""

    ranges: list[tuple[int, int]]
    negated: bool = False


@dataclass
class _Token:
    token: int
    negated: bool = False


@dataclass
class _Ref:
    rule: int  # index into the rule table


@dataclass
class _Repeat:
    item: Item
    low: int
    high: int | None  # None: no maximum


@dataclass
class _Literal:
    codepoints: list[int]


Item = _Chars | _Token | _Ref | _Repeat | _Literal
Sequence_ = list[Item]


@dataclass
class _Rule:
    name: str
    alternatives: list[Sequence_] | None = None  # None: referenced, not (yet) defined
    synthesized: bool = False


@dataclass
class _Frame:
    """A rule body being parsed: its alternatives, the open one last; for a group, the
    sequence it will be referenced from."""

    rule: int
    alternatives: list[Sequence_] = field(default_factory=lambda: [[]])


class _Parser:
    def __init__(self, text: str, token_for: Callable[[str], int | None], n_vocab: int) -> None:
        self.src = text
        self.pos = 0
        self.token_for = token_for
        self.n_vocab = n_vocab
        self.rules: list[_Rule] = []
        self.ids: dict[str, int] = {}

    # Positions and errors.
    def _at(self, offset: int = 0) -> str:
        i = self.pos + offset
        return self.src[i] if i < len(self.src) else ""

    def _fail(self, message: str, at: int | None = None) -> GbnfError:
        start = self.pos if at is None else at
        excerpt = self.src[start : start + _EXCERPT]
        where = f" at {excerpt!r}" if excerpt else " at the end"
        return GbnfError(message + where)

    def _space(self, newline_ok: bool) -> None:
        src, n = self.src, len(self.src)
        while self.pos < n:
            c = src[self.pos]
            if c == "#":
                while self.pos < n and src[self.pos] not in "\r\n":
                    self.pos += 1
            elif c in " \t" or (newline_ok and c in "\r\n"):
                self.pos += 1
            else:
                return

    def _name(self) -> str:
        start = self.pos
        while _is_word_char(self._at()):
            self.pos += 1
        if self.pos == start:
            raise self._fail("expecting name")
        return self.src[start : self.pos]

    def _int(self) -> int:
        start = self.pos
        while self._at().isascii() and self._at().isdigit():
            self.pos += 1
        if self.pos == start:
            raise self._fail("expecting integer")
        return int(self.src[start : self.pos])

    def _symbol(self, name: str) -> int:
        if name not in self.ids:
            self.ids[name] = len(self.rules)
            self.rules.append(_Rule(name))
        return self.ids[name]

    def _synthesized(self, parent: int) -> int:
        self.rules.append(_Rule(f"{self.rules[parent].name}_{len(self.rules)}", synthesized=True))
        return len(self.rules) - 1

    # The grammar.
    def parse(self) -> list[_Rule]:
        self._space(newline_ok=True)
        while self.pos < len(self.src):
            self._rule()
        for rule in self.rules:
            if rule.alternatives is None:
                raise GbnfError(f"Undefined rule identifier '{rule.name}'")
        if "root" not in self.ids:
            raise GbnfError("the grammar has no `root` rule")
        return self.rules

    def _rule(self) -> None:
        name = self._name()
        self._space(newline_ok=False)
        if self.src.startswith("::=", self.pos):
            self.pos += 3
        else:
            raise self._fail("expecting ::=")
        self._space(newline_ok=True)
        rule = self._symbol(name)
        self.rules[rule].alternatives = self._alternatives(rule)
        if self._at() == "\r":
            self.pos += 2 if self._at(1) == "\n" else 1
        elif self._at() == "\n":
            self.pos += 1
        elif self._at():
            raise self._fail("expecting newline or end")
        self._space(newline_ok=True)

    def _alternatives(self, rule: int) -> list[Sequence_]:
        """A rule's body; groups nest through an explicit stack, not recursion."""
        stack = [_Frame(rule)]
        while True:
            frame = stack[-1]
            nested = len(stack) > 1
            c = self._at()
            if c == "(":
                self.pos += 1
                self._space(newline_ok=True)
                stack.append(_Frame(self._synthesized(rule)))
            elif c == "|":
                self.pos += 1
                self._space(newline_ok=True)
                frame.alternatives.append([])
            elif c == ")" and nested:
                self.pos += 1
                stack.pop()
                self.rules[frame.rule].alternatives = frame.alternatives
                stack[-1].alternatives[-1].append(_Ref(frame.rule))
                self._space(newline_ok=len(stack) > 1)
            elif self._item(frame.alternatives[-1], nested, rule):
                pass
            elif nested:
                raise self._fail("expecting ')'")
            else:
                return frame.alternatives

    def _item(self, seq: Sequence_, nested: bool, rule: int) -> bool:
        """Parse one item or repetition onto `seq`; False when none starts here."""
        c = self._at()
        if not c:
            return False
        if c == '"':
            self.pos += 1
            chars = []
            while self._at() != '"':
                if not self._at():
                    raise GbnfError("unexpected end of input")
                chars.append(self._char())
            self.pos += 1
            seq.append(_Literal(chars))
        elif c == "[":
            seq.append(self._class())
        elif c in "<!":
            seq.append(self._token())
        elif _is_word_char(c):
            seq.append(_Ref(self._symbol(self._name())))
        elif c == ".":
            self.pos += 1
            seq.append(_Chars([], negated=True))
        elif c in "*+?{":
            start = self.pos
            low, high = self._repetition(nested)
            if not seq:
                raise self._fail("expecting preceding item to */+/?/{", start)
            seq[-1] = _Repeat(self._single(seq[-1], rule), low, high)
            return True  # _repetition skipped the space after it
        else:
            return False
        self._space(newline_ok=nested)
        return True

    def _single(self, item: Item, rule: int) -> Item:
        """`item` as one Lark symbol, so that repeating it nests nothing: a literal of
        several characters or a repetition becomes a rule of its own."""
        if isinstance(item, _Repeat) or (isinstance(item, _Literal) and len(item.codepoints) > 1):
            own = self._synthesized(rule)
            self.rules[own].alternatives = [[item]]
            return _Ref(own)
        return item

    def _repetition(self, nested: bool) -> tuple[int, int | None]:
        c = self._at()
        self.pos += 1
        if c != "{":
            self._space(nested)
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        self._space(nested)
        if not (self._at().isascii() and self._at().isdigit()):
            raise self._fail("expecting an int")
        low = self._int()
        self._space(nested)
        high: int | None
        if self._at() == "}":
            high = low
        elif self._at() == ",":
            self.pos += 1
            self._space(nested)
            high = self._int() if self._at().isascii() and self._at().isdigit() else None
            self._space(nested)
            if self._at() != "}":
                raise self._fail("expecting '}'")
        else:
            raise self._fail("expecting ','")
        self.pos += 1
        self._space(nested)
        if low > MAX_REPETITION:
            raise GbnfError("number of repetitions exceeds sane defaults (at most 2000)")
        if high is not None and high > MAX_REPETITION:
            high = None  # llama.cpp's reading of a maximum past its threshold
        if high is not None and high < low:
            raise GbnfError(f"repetition {{{low},{high}}} has its maximum below its minimum")
        return low, high

    def _char(self) -> int:
        """One character of a literal or class, escapes decoded (llama.cpp's parse_char)."""
        c = self._at()
        if c != "\\":
            self.pos += 1
            return ord(c)
        escape = self._at(1)
        sizes = {"x": 2, "u": 4, "U": 8}
        if escape in sizes:
            digits = self.src[self.pos + 2 : self.pos + 2 + sizes[escape]]
            if len(digits) != sizes[escape] or any(d not in _HEX for d in digits):
                raise self._fail(f"expecting {sizes[escape]} hex chars")
            self.pos += 2 + sizes[escape]
            return int(digits, 16)
        simple = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]"}
        simple["-"] = "-"
        if escape in simple:
            self.pos += 2
            return ord(simple[escape])
        raise self._fail("unknown escape")

    def _class(self) -> _Chars:
        self.pos += 1  # [
        negated = self._at() == "^"
        if negated:
            self.pos += 1
        ranges = []
        while self._at() != "]":
            if not self._at():
                raise GbnfError("unexpected end of input")
            low = self._char()
            high = low
            if self._at() == "-" and self._at(1) != "]":
                if not self._at(1):
                    raise GbnfError("unexpected end of input")
                self.pos += 1
                high = self._char()
            ranges.append((low, high))
        self.pos += 1
        return _Chars(ranges, negated)

    def _token(self) -> _Token:
        start = self.pos
        negated = self._at() == "!"
        if negated:
            self.pos += 1
        if self._at() != "<":
            raise self._fail("expecting '<'")
        if self._at(1) == "[":
            self.pos += 2
            token = self._int()
            if self._at() != "]" or self._at(1) != ">":
                raise self._fail("expecting ']>'")
            self.pos += 2
        else:
            end = self.src.find(">", self.pos)
            if end < 0:
                raise self._fail("expecting '>'")
            spelled = self.src[self.pos : end + 1]
            found = self.token_for(spelled)
            if found is None:
                raise GbnfError(f"invalid token '{spelled[:_EXCERPT]}': not one token")
            token = found
            self.pos = end + 1
        if not 0 <= token < self.n_vocab:
            raise self._fail(
                f"token id {token} is not in the vocabulary [0, {self.n_vocab})", start
            )
        return _Token(token, negated)


_HEX = frozenset("0123456789abcdefABCDEF")


def _is_word_char(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "-")


# -- rendering: one lexeme per character ----------------------------------------------


def _render(rules: list[_Rule], eog_tokens: Sequence[int]) -> str:
    names = _lark_names(rules)
    eog = ",".join(str(t) for t in sorted(set(eog_tokens)))
    lines = ["%llguidance {}", f"start: {names[_root(rules)]}"]
    for i, rule in enumerate(rules):
        assert rule.alternatives is not None
        body = " | ".join(_sequence(seq, names, eog) for seq in rule.alternatives)
        lines.append(f"{names[i]}: {body}")
    return "\n".join(lines) + "\n"


def _root(rules: list[_Rule]) -> int:
    return next(i for i, r in enumerate(rules) if r.name == "root" and not r.synthesized)


def _lark_names(rules: list[_Rule]) -> list[str]:
    """Lowercase Lark names (uppercase ones would be lexemes), unique, `start` kept free."""
    taken = {"start"}
    names = []
    for rule in rules:
        base = rule.name.lower().replace("-", "_")
        if not base[0].isalpha():
            base = f"r_{base}"
        name = f"{base}_" if base in taken else base
        k = 1
        while name in taken:
            name = f"{base}_{k}"
            k += 1
        taken.add(name)
        names.append(name)
    return names


def _sequence(seq: Sequence_, names: list[str], eog: str) -> str:
    parts = [_item(item, names, eog) for item in seq]
    parts = [p for p in parts if p]
    return " ".join(parts) if parts else '""'


def _item(item: Item, names: list[str], eog: str) -> str:
    if isinstance(item, _Literal):
        return " ".join(_char_lexeme([(c, c)], False) for c in item.codepoints)
    if isinstance(item, _Chars):
        return _char_lexeme(item.ranges, item.negated)
    if isinstance(item, _Token):
        if item.negated:  # never an end of generation: llama.cpp's grammar ends on those
            return f"<[^{item.token},{eog}]>" if eog else f"<[^{item.token}]>"
        return f"<[{item.token}]>"
    if isinstance(item, _Ref):
        return names[item.rule]
    inner = _item(item.item, names, eog)  # one symbol (_Parser._single)
    if not inner or item.high == 0:
        return ""
    if (item.low, item.high) == (0, None):
        return f"{inner}*"
    if (item.low, item.high) == (1, None):
        return f"{inner}+"
    if (item.low, item.high) == (0, 1):
        return f"{inner}?"
    if item.high is None:
        return f"{inner}{{{item.low},}}"
    if item.low == item.high:
        return f"{inner}{{{item.low}}}"
    return f"{inner}{{{item.low},{item.high}}}"


def _char_lexeme(ranges: list[tuple[int, int]], negated: bool) -> str:
    """A lexeme of exactly one character: a class of code point ranges as a Rust regex.
    Reversed ranges and surrogates match nothing (as in llama.cpp, where no character
    decoded from UTF-8 falls in them), and neither does NUL."""
    valid = [part for lo, hi in ranges for part in _clip(lo, hi)]
    body = "".join(_escape(lo) if lo == hi else f"{_escape(lo)}-{_escape(hi)}" for lo, hi in valid)
    if negated:
        return f"/[^\\x{{0}}{body}]/"
    if not valid:
        return "/[^\\x{0}-\\x{10FFFF}]/"
    return f"/{body}/" if len(valid) == 1 and valid[0][0] == valid[0][1] else f"/[{body}]/"


def _clip(lo: int, hi: int) -> list[tuple[int, int]]:
    """The part of lo..hi that llama.cpp can match: Unicode scalar values but NUL (it
    reads token pieces as C strings)."""
    lo, hi = max(lo, 1), min(hi, _MAX_CODEPOINT)
    if lo > hi:
        return []
    out = []
    if lo < _SURROGATES[0]:
        out.append((lo, min(hi, _SURROGATES[0] - 1)))
    if hi > _SURROGATES[1]:
        out.append((max(lo, _SURROGATES[1] + 1), hi))
    return out


def _escape(codepoint: int) -> str:
    c = chr(codepoint)
    if c.isascii() and c.isalnum():
        return c
    return f"\\x{{{codepoint:X}}}"
