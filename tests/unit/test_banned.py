"""Banned phrases: the hold-back guard on its own, and the engine rewinding branches over
the fake context (KV cells, tokens, text, sampler history), other branches unaffected."""

from __future__ import annotations

from collections.abc import Sequence

from llama_srb.engine.request import Branch, FinishReason, Request
from llama_srb.sampling.banned import MAX_BANS_PER_POSITION, Bans, PhraseGuard
from llama_srb.sampling.params import SamplingParams
from llama_srb.sampling.text import TextStream
from tests.unit.fake_context import (
    BOS,
    FakeModel,
    FakeSampler,
    bare_request,
    expected,
    make_engine,
    run,
)

# -- the guard alone: multi-character tokens, as a real vocabulary has ------------------


def push_all(guard: PhraseGuard, pieces: Sequence[str]) -> list[str]:
    return [guard.push(p, i) for i, p in enumerate(pieces)]


def test_text_that_could_begin_a_phrase_is_held_from_the_start_of_its_token() -> None:
    guard = PhraseGuard(["shivers down"])
    out = push_all(guard, ["It sent", " shiv", "ers", " up"])
    # " shiv" is held whole (its space too): the token would be taken back with it.
    assert out == ["It sent", "", "", " shivers up"]
    assert guard.banned_at is None and guard.released == 4


def test_a_phrase_is_found_across_tokens_and_rewinds_to_the_token_it_began_in() -> None:
    guard = PhraseGuard(["shivers down"])
    assert push_all(guard, ["It sent", " shiv", "ers", " down"]) == ["It sent", "", "", ""]
    assert guard.banned_at == 1  # " shiv": the phrase began inside it
    assert guard.rewind(1) == 1  # the state pushed with token 1
    assert guard.push(" a chill", 9) == " a chill"
    assert guard.flush() == ""


def test_case_insensitive_by_default_and_sensitive_on_request() -> None:
    loose = PhraseGuard(["Tapestry"])
    push_all(loose, ["a rich", " TAPESTRY"])
    assert loose.banned_at == 1
    strict = PhraseGuard(["Tapestry"], case_sensitive=True)
    assert push_all(strict, ["a rich", " TAPESTRY"]) == ["a rich", " TAPESTRY"]
    assert strict.banned_at is None


def test_flush_releases_the_start_of_a_phrase_that_never_came() -> None:
    guard = PhraseGuard(["the end of"])
    assert push_all(guard, ["and", " the", " end"]) == ["and", "", ""]
    assert guard.flush("!") == " the end!"


def test_a_token_without_text_is_held_with_the_character_it_begins() -> None:
    guard = PhraseGuard(["zzz"])
    # token 1 gave half a character (no text yet): held until token 2 completes it
    assert push_all(guard, ["ab", "", "é"]) == ["ab", "", "é"]
    guard = PhraseGuard(["éx"])
    push_all(guard, ["ab", "", "é", "x"])
    assert guard.banned_at == 1  # back to the token that began the character


def test_stream_keeps_stop_strings_and_rewinds_its_detokenizer() -> None:
    pieces = {10: "Once", 11: " upon", 12: " a", 13: " time", 14: " hill", 15: "\n"}
    stream = TextStream(lambda t: pieces[t].encode(), ["\n"], ["a time"])
    assert [stream.push(t, True) for t in (10, 11, 12)] == ["Once", " upon", ""]
    assert stream.push(13, True) == "" and stream.banned_at == 2
    stream.rewind(2)
    assert stream.released == 2
    assert stream.push(12, True) == ""  # " a" could begin the phrase again
    assert stream.push(14, True) == " a hill"
    assert stream.push(15, True) == "" and stream.stopped


def test_bans_are_bounded_per_position_and_cleared_after_an_earlier_rewind() -> None:
    bans = Bans()
    assert bans.ban(5, 7) and bans.ban(9, 8)
    assert bans.ban(3, 1) and bans.at(5) is None and bans.at(9) is None
    results = [bans.ban(2, t) for t in range(MAX_BANS_PER_POSITION + 1)]
    assert all(results[:-1]) and not results[-1]


# -- the engine over the fake context --------------------------------------------------


class RewindingSampler(FakeSampler):
    """The fake's rank-th pick, and a record of the histories it was rewound to."""

    def __init__(self, rank: int = 0) -> None:
        super().__init__(rank)
        self.rewinds: list[list[int]] = []

    def rewind(self, kept: list[int]) -> None:
        self.rewinds.append(list(kept))


def spell(tokens: Sequence[int]) -> str:
    return b"".join(FakeModel.piece(t) for t in tokens).decode()


def banned_request(prompt: list[int], n: int, banned: tuple[str, ...], **params: object) -> Request:
    stop = SamplingParams(**params).stop  # type: ignore[arg-type]
    branches = [
        Branch(
            index=i,
            sampler=RewindingSampler(i),
            text=TextStream(FakeModel.piece, stop, banned),
            bans=Bans(),
        )
        for i in range(n)
    ]
    return bare_request("r", prompt, branches, banned_strings=banned, **params)


PROMPT = [BOS, *FakeModel.tokens("onceuponatime")]


def test_a_banned_phrase_never_appears_and_only_its_branch_is_rewound() -> None:
    free = [spell(expected(PROMPT, rank, 12)) for rank in range(3)]
    phrase = free[0][4:7]  # what greedy decoding writes
    assert phrase not in free[1] and phrase not in free[2]
    engine, _ = make_engine(n_batch=16)
    request = banned_request(PROMPT, 3, (phrase,), max_tokens=12)
    engine.add(request)
    out = run(engine)  # checks the KV books after every step
    text = out.text("r")
    assert phrase not in text[0]
    assert text[0][:4] == free[0][:4]  # the branch kept what came before the phrase
    assert text[1] == free[1] and text[2] == free[2]  # others went on untouched
    assert out.reasons("r") == {i: FinishReason.LENGTH for i in range(3)}
    tokens = out.tokens("r")
    assert spell(tokens[0]) == text[0] and len(tokens[0]) == 12
    first = request.branches[0].sampler
    assert isinstance(first, RewindingSampler)
    assert first.rewinds[0] == FakeModel.tokens(free[0][:4])  # its history: what was kept
    assert out.last("r").completion_tokens == 36


def test_streamed_deltas_never_show_any_part_of_a_banned_phrase() -> None:
    free = spell(expected(PROMPT, 0, 16))
    phrase = free[6:10]
    engine, _ = make_engine(n_batch=16)
    request = banned_request(PROMPT, 1, (phrase,), max_tokens=16, logprobs=2)
    engine.add(request)
    out = run(engine)
    deltas = [c for o in out.by_request["r"] for c in o.choices]
    shown = ""
    for delta in deltas:
        shown += delta.text
        assert phrase not in shown
        # tokens and logprobs go out with their text, never ahead of it
        assert spell(delta.token_ids) == delta.text
        assert [e.token for e in delta.logprobs or []] == delta.token_ids
    assert shown[:6] == free[:6] and len(out.tokens("r")[0]) == 16


def test_a_phrase_at_the_very_start_rewinds_to_the_prompts_last_row() -> None:
    free = spell(expected(PROMPT, 0, 8))
    phrase = free[:3]
    engine, _ = make_engine(n_batch=16)
    request = banned_request(PROMPT, 2, (phrase,), max_tokens=8)
    engine.add(request)
    out = run(engine)
    text = out.text("r")
    assert not text[0].startswith(phrase) and phrase not in text[0]
    assert len(out.tokens("r")[0]) == 8
    assert text[1] == spell(expected(PROMPT, 1, 8))
    assert request.first_row is not None


def test_every_candidate_banned_ends_the_branch_before_the_phrase() -> None:
    # Every letter is banned: after the bound of bans at one position, the branch ends.
    engine, _ = make_engine(n_batch=16)
    request = banned_request(PROMPT, 1, tuple("abcdefghijklmnopqrstuvwxyz"), max_tokens=6)
    engine.add(request)
    out = run(engine)
    assert out.reasons("r") == {0: FinishReason.STOP}
    assert out.text("r") == {0: ""} and out.tokens("r") == {0: []}
    bans = request.branches[0].bans
    assert bans is not None and len(bans.at(0) or []) == MAX_BANS_PER_POSITION + 1
