"""Banned patterns (`banned_regex`): their RE2 forms, the guard holding back what could
still grow into a match (bounded), matches judged only when no text to come can undo
them, the 400s, linear time, and the engine rewinding branches over the fake context."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import re2

from llama_srb.engine.request import Branch, FinishReason, Request
from llama_srb.sampling import patterns as patterns_module
from llama_srb.sampling.banned import Bans, PhraseGuard
from llama_srb.sampling.params import ParamError, SamplingParams
from llama_srb.sampling.patterns import (
    MAX_BANNED_REGEX,
    MAX_HOLD_CHARS,
    MAX_REGEX_CHARS,
    canonical,
    compiled,
)
from llama_srb.sampling.text import TextStream
from tests.unit.fake_context import (
    BOS,
    Ends,
    FakeModel,
    bare_request,
    expected,
    make_engine,
    run,
)
from tests.unit.test_banned import RewindingSampler


def guard(*patterns: str, case_sensitive: bool = False, phrases: Sequence[str] = ()) -> PhraseGuard:
    return PhraseGuard(phrases, case_sensitive, compiled(patterns, case_sensitive))


def push_all(g: PhraseGuard, pieces: Sequence[str]) -> list[str]:
    return [g.push(p, i) for i, p in enumerate(pieces)]


# -- the prefix forms: every prefix of a match, and nothing that cannot begin one --------


@pytest.mark.parametrize(
    "pattern, prefixes, not_prefixes",
    [
        (
            r"knuckles (?:turning )?white(?:ned)?",
            ["knuck", "knuckles tur", "knuckles whi"],
            ["knuckles b"],
        ),
        (r"\bher \w+ \w+ white", ["her", "her hands went wh"], ["her hands went black", "hero"]),
        (r"not \w+, but", ["not", "not only", "not only, b"], ["not only."]),
        (r"a{2,3}b", ["", "a", "aa", "aaa", "aaab"], ["aaaa", "ab"]),
        (r"(?:ab|cd)+e", ["abcd", "abcda", "abe"], ["abd", "ac"]),
    ],
)
def test_the_prefix_form_takes_exactly_the_starts_of_matches(
    pattern: str, prefixes: list[str], not_prefixes: list[str]
) -> None:
    form = re2.compile(canonical(pattern).prefixes)
    for text in prefixes:
        assert form.fullmatch(text), text
    for text in not_prefixes:
        assert not form.fullmatch(text), text


def test_the_canonical_form_matches_what_the_pattern_matches() -> None:
    for pattern, text in [
        (r"(?i)Knuckles\s+white", "KNUCKLES  WHITE"),
        (r"[^a-c\d]x", "dx"),
        (r"colou?r", "color"),
        (r"(?s)a.b", "a\nb"),
        (r"\bcafé", "a café"),  # RE2's \b and \w are ASCII: é is not a word character
    ]:
        assert re2.search(canonical(pattern).match, text), pattern


# -- the guard: hold, match, rewind -----------------------------------------------------


def test_a_match_across_tokens_rewinds_to_the_token_it_began_in() -> None:
    g = guard(r"knuckles (?:turning )?white")
    out = push_all(g, ["Her", " knuck", "les", " turning", " wh", "ite", "."])
    assert out[:6] == ["Her", "", "", "", "", ""] and g.banned_at == 1
    assert g.rewind(1) == 1
    assert g.push(" hands", 9) == " hands"


def test_a_word_boundary_at_the_end_waits_for_the_next_character() -> None:
    g = guard(r"\bthe\b")
    assert push_all(g, ["in", " the"]) == ["in", ""]
    assert g.banned_at is None  # "the" or "there": not known yet
    assert g.push("re", 2) == " there" and g.banned_at is None
    g = guard(r"\bthe\b")
    push_all(g, ["in", " the", " sea"])
    assert g.banned_at == 1


def test_at_the_end_of_a_branch_a_match_is_judged_with_the_real_end() -> None:
    g = guard(r"\bthe\b")
    push_all(g, ["in", " the"])
    assert g.end() == 1  # end of generation right after "the"
    g = guard(r"\bthe\b")
    g.push("in", 0)
    g.push(" the", 1, final=True)  # the branch's last token (max_tokens)
    assert g.banned_at == 1


def test_a_boundary_at_the_start_sees_the_released_text_before_it() -> None:
    g = guard(r"\bsea\w*")
    assert push_all(g, ["over", "sea", "s"]) == ["over", "sea", "s"]
    assert g.banned_at is None
    g = guard(r"\bsea\w*")
    push_all(g, ["over", " sea"])
    assert g.banned_at == 1


def test_case_insensitive_unless_asked() -> None:
    loose = guard(r"tap\w+stry")
    push_all(loose, ["a rich", " TAPESTRY", "."])
    assert loose.banned_at == 1
    strict = guard(r"tap\w+stry", case_sensitive=True)
    assert push_all(strict, ["a rich", " TAPESTRY", "."]) == ["a rich", " TAPESTRY", "."]


def test_phrases_and_patterns_together() -> None:
    g = guard(r"\bsea\w*", phrases=["shivers"])
    push_all(g, ["A", " shiv", "ers"])
    assert g.banned_at == 1
    g = guard(r"\bsea\w*", phrases=["shivers"])
    push_all(g, ["A", " seas", "ide", " view"])
    assert g.banned_at == 1


def test_the_hold_is_bounded_for_a_pattern_that_stays_open() -> None:
    g = guard(r"once.*never")  # open from "once" until "never", however far
    shown = g.push("once", 0)
    for i in range(1, 200):
        shown += g.push(" upon", i)
        held = g.held_tokens * len(" upon")
        assert held <= MAX_HOLD_CHARS + len(" upon")
    assert shown.startswith("once upon")  # the start went out once it was too far back
    assert g.banned_at is None


def test_a_streamed_guard_never_releases_any_part_of_a_match() -> None:
    patterns = (r"\bher \w+ \w+ white", r"not \w+, but")
    text = "She saw her knuckles go white, not once, but twice; her hands were white too."
    for size in (1, 2, 3, 5):
        g = guard(*patterns)
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        shown = ""
        for i, piece in enumerate(pieces):
            shown += g.push(piece, i)
            if g.banned_at is not None:
                break
        assert g.banned_at is not None
        start = re2.search(r"(?i)\bher \w+ \w+ white", text)
        assert start is not None and len(shown) <= start.start()


# -- bounds, 400s and time --------------------------------------------------------------


@pytest.mark.parametrize(
    "patterns, says",
    [
        ((r"(?<=a)b",), "(?<=a)b"),  # RE2 has no look-behind
        ((r"(a)\1",), "banned_regex[0]"),  # nor back-references
        ((r"[[:alpha:]",), "[[:alpha:]"),
        ((r"\p{L}+",), "\\p{L}+"),  # RE2 takes it; the prefix analysis does not
        ((r"x{1001}",), "x{1001}"),
        (("",), "empty"),
        (("x" * (MAX_REGEX_CHARS + 1),), "at most"),
        (("a",) * (MAX_BANNED_REGEX + 1), "at most"),
    ],
)
def test_a_pattern_the_engine_cannot_take_is_named(patterns: tuple[str, ...], says: str) -> None:
    with pytest.raises(ParamError) as info:
        SamplingParams(banned_regex=patterns)
    assert info.value.param == "banned_regex"
    assert says in str(info.value)


def test_where_re2_cannot_load_beside_llama_cpp_a_pattern_is_refused_not_a_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server loads google-re2 only once a child process held it beside llama.cpp (on
    a CUDA build the two crashed one process); where that child dies, as here, a request
    with a pattern gets a 400 that says what to use instead, and nothing is loaded."""
    monkeypatch.setattr(patterns_module, "PROBE", "import os; os.abort()")
    patterns_module._binding_or_reason.cache_clear()
    try:
        with pytest.raises(ParamError) as info:
            SamplingParams(banned_regex=(r"\bshe smiled",))
        assert info.value.param == "banned_regex"
        assert "unavailable" in str(info.value) and "banned_strings" in str(info.value)
        assert SamplingParams(banned_strings=("she smiled",)).banned_strings  # still served
    finally:
        monkeypatch.undo()
        patterns_module._binding_or_reason.cache_clear()
    assert SamplingParams(banned_regex=(r"\bshe smiled",)).banned_regex  # the probe passes


def test_catastrophic_patterns_cost_linear_time() -> None:
    """A backtracking engine would not end these scans (the paths grow as 2^n in the a's);
    RE2's do, and hold every a (each could be part of a match still)."""
    patterns = (r"(a+)+$", r"(a|aa)+b", r"(.*a){12}", r"(x+x+)+y")
    params = SamplingParams(banned_regex=patterns)
    g = guard(*params.banned_regex)
    assert [g.push("a", i) for i in range(400)] == [""] * 400


def test_the_bound_on_patterns_is_accepted_and_compiles() -> None:
    patterns = tuple(rf"\bword{i}\w* (?:of|in) the \w+" for i in range(MAX_BANNED_REGEX))
    params = SamplingParams(banned_regex=patterns)
    assert len(params.banned_regex) == MAX_BANNED_REGEX


# -- the engine over the fake context ----------------------------------------------------


def spell(tokens: Sequence[int]) -> str:
    return b"".join(FakeModel.piece(t) for t in tokens).decode()


def regex_request(
    prompt: list[int], n: int, patterns: tuple[str, ...], **params: object
) -> Request:
    sampling = SamplingParams(banned_regex=patterns, **params)  # type: ignore[arg-type]
    compiled_set = compiled(patterns, False)
    branches = [
        Branch(
            index=i,
            sampler=RewindingSampler(i),
            text=TextStream(FakeModel.piece, sampling.stop, (), False, compiled_set),
            bans=Bans(),
        )
        for i in range(n)
    ]
    return bare_request("r", prompt, branches, banned_regex=patterns, **params)


PROMPT = [BOS, *FakeModel.tokens("onceuponatime")]


def test_no_branch_matches_and_only_the_matching_branch_is_rewound() -> None:
    free = [spell(expected(PROMPT, rank, 14)) for rank in range(3)]
    pattern = f"{free[0][4]}[a-z]{free[0][6]}"  # what greedy decoding writes, as a pattern
    others = [f for f in free[1:] if not re2.search(pattern, f)]
    engine, _ = make_engine(n_batch=16)
    request = regex_request(PROMPT, 3, (pattern,), max_tokens=14)
    engine.add(request)
    out = run(engine)  # checks the KV books after every step
    text = out.text("r")
    assert all(not re2.search(pattern, t) for t in text.values())
    assert text[0][:4] == free[0][:4]
    assert [t for t in (text[1], text[2]) if t in others] == others
    assert out.reasons("r") == {i: FinishReason.LENGTH for i in range(3)}


def test_streamed_deltas_never_show_any_part_of_a_match() -> None:
    free = spell(expected(PROMPT, 0, 16))
    pattern = f"{free[6]}\\w{{2}}{free[9]}"
    engine, _ = make_engine(n_batch=16)
    engine.add(regex_request(PROMPT, 1, (pattern,), max_tokens=16))
    out = run(engine)
    shown = ""
    for delta in (c for o in out.by_request["r"] for c in o.choices):
        shown += delta.text
        assert not re2.search(pattern, shown)
        assert spell(delta.token_ids) == delta.text
    assert shown[:6] == free[:6] and len(out.tokens("r")[0]) == 16


def test_a_match_only_at_the_end_of_generation_is_taken_back_too() -> None:
    table = Ends(len(PROMPT), 6)
    free = spell(expected(PROMPT, 0, 6, table))
    pattern = f"{free[3:6]}\\z"  # matches only where the text ends
    engine, _ = make_engine(n_batch=16, table=table)
    request = regex_request(PROMPT, 1, (pattern,), max_tokens=12)
    engine.add(request)
    out = run(engine)
    text = out.text("r")[0]
    assert not re2.search(pattern, text)
    assert text[:3] == free[:3]
    bans = request.branches[0].bans
    assert bans is not None and bans.rewinds >= 1
