"""A branch's step (engine/branch_step.py) from a logits row alone, no model and no engine:
every way a step can end (a token kept, a stop string, end-of-generation, max_tokens, a
complete grammar), what min_tokens and ignore_eos mask, the four ways a banned phrase
takes a branch back (NOW, FIRST, LATER, END) with the KV changes each returns, distinct
openings, and the scores a step records.

The branches are real (Branch, TextStream, Bans, SamplingParams, Row, RowScores); only the
sampler is a stand-in: the most likely token the step lets it take, or a scripted one."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from llama_srb.engine.branch_step import BranchStep, scores_of
from llama_srb.engine.kv import KvOp
from llama_srb.engine.outputs import ChoiceDelta, FinishReason
from llama_srb.engine.request import Branch, Request
from llama_srb.sampling.banned import MAX_BANS_PER_POSITION, MAX_REWINDS, Bans
from llama_srb.sampling.constraint import GRAMMAR_COMPLETE
from llama_srb.sampling.cut import Row
from llama_srb.sampling.masks import MaskBatch
from llama_srb.sampling.params import SamplingParams
from llama_srb.sampling.patterns import compiled
from llama_srb.sampling.text import TextStream
from tests.unit.fake_context import BOS, EOS, LETTERS, N_VOCAB, FakeModel, bare_request

PROMPT = [BOS, *FakeModel.tokens("once")]
P = len(PROMPT)  # the first generated token's position
SEQ = 5  # the branch's sequence id, as if admitted


def tok(letter: str) -> int:
    (token,) = FakeModel.tokens(letter)
    return token


def row(best: str = "", eos_first: bool = False) -> Row:
    """A row whose most likely tokens are `best`'s letters, in order (end-of-generation
    first with `eos_first`), then every other letter, end-of-generation and BOS."""
    first = ([EOS] if eos_first else []) + [tok(c) for c in best]
    order = first + [t for t in [*LETTERS, EOS, BOS] if t not in first]
    logits = np.empty(N_VOCAB, np.float32)
    logits[order] = -np.arange(N_VOCAB, dtype=np.float32)
    return Row(logits)


@dataclass
class Draw:
    """What the step handed the sampler for one draw."""

    logits: npt.NDArray[np.float32]
    forbidden: set[int]
    taken: set[int] | None
    mask: Any


class Sampler:
    """The row's most likely token that is neither forbidden nor taken (a distinct
    opening), or the next of `script` while it lasts; records each draw and rewind."""

    def __init__(self, script: Sequence[int] = (), matcher: object = None) -> None:
        self.script = list(script)
        self.matcher = matcher
        self.draws: list[Draw] = []
        self.rewinds: list[list[int]] = []
        self.accepted: list[int] = []

    def sample(
        self,
        row: Row,
        forbidden: npt.NDArray[np.int64] | None = None,
        taken: set[int] | None = None,
        mask: Any = None,
    ) -> int:
        banned = set() if forbidden is None else {int(t) for t in forbidden}
        self.draws.append(
            Draw(row.logits.copy(), banned, None if taken is None else set(taken), mask)
        )
        if self.script:
            return self.script.pop(0)
        order = [int(t) for t in np.argsort(-row.logits, kind="stable")]
        return next(t for t in order if t not in banned and t not in (taken or ()))

    def accept(self, token: int) -> None:
        self.accepted.append(token)

    def rewind(self, kept: list[int]) -> None:
        self.rewinds.append(list(kept))

    def close(self) -> None:
        pass


class Masks:
    """Stands in for MaskBatch: a grammar's mask is a label here (the sampler only passes
    it on); `fill` gives each matcher its first mask."""

    def __init__(self) -> None:
        self.filled: list[list[object]] = []

    def fill(self, matchers: list[object]) -> list[str]:
        self.filled.append(list(matchers))
        return [f"first mask of {m}" for m in matchers]


def branch_of(params: SamplingParams, sampler: Sampler, index: int = 0) -> Branch:
    patterns = compiled(params.banned_regex, False) if params.banned_regex else None
    text = TextStream(FakeModel.piece, params.stop, params.banned_strings, patterns=patterns)
    bans = Bans() if params.bans_text else None
    return Branch(index=index, sampler=sampler, text=text, seq_id=SEQ + index, bans=bans)


def make_step(
    script: Sequence[int] = (), n: int = 1, masks: object = None, **params: Any
) -> tuple[BranchStep, Request, Sampler]:
    """A step over the fake vocabulary and a request of `n` branches (branch 0's sampler
    returned), admitted and past its prompt."""
    sampling = SamplingParams(**params)
    samplers = [Sampler(script if i == 0 else ()) for i in range(n)]
    branches = [branch_of(sampling, s, i) for i, s in enumerate(samplers)]
    request = bare_request("r", PROMPT, branches, **params)
    step = BranchStep(FakeModel.eog_tokens, masks or MaskBatch(N_VOCAB))  # type: ignore[arg-type]
    return step, request, samplers[0]


def next_(
    step: BranchStep, request: Request, the_row: Row, index: int = 0, **kwargs: Any
) -> tuple[ChoiceDelta, list[KvOp]]:
    branch = request.branches[index]
    scores = kwargs.pop("scores", scores_of(request, the_row))
    return step.next(request, branch, the_row, scores, **kwargs)


def spell(tokens: Sequence[int]) -> str:
    return FakeModel().text(tokens)


# -- a token kept, and each way a branch ends ----------------------------------------------


def test_a_kept_token_goes_out_with_its_text_and_has_no_cell_yet() -> None:
    step, request, sampler = make_step(max_tokens=8)
    delta, ops = next_(step, request, row("c"))
    assert delta == ChoiceDelta(0, "c", [tok("c")], None, None, newest_has_no_cell=True)
    assert ops == [] and request.branches[0].tokens == [tok("c")]
    assert step.drawn == 1 and len(sampler.draws) == 1
    assert sampler.draws[0].forbidden == set()  # nothing masked: EOS may come


def test_a_stop_string_ends_the_branch_and_text_that_may_begin_one_is_held() -> None:
    step, request, _ = make_step(max_tokens=8, stop=("xy",))
    assert next_(step, request, row("b"))[0].text == "b"
    held, _ = next_(step, request, row("x"))
    assert held.text == "" and held.finish_reason is None  # "x" may begin "xy"
    went_on, _ = next_(step, request, row("z"))
    assert went_on.text == "xz" and went_on.finish_reason is None
    next_(step, request, row("x"))
    stopped, ops = next_(step, request, row("y"))
    assert stopped.finish_reason is FinishReason.STOP and stopped.text == "" and ops == []
    assert spell(request.branches[0].tokens) == "bxzxy"  # the tokens stay; the text stops


def test_stops_are_not_checked_until_min_tokens_are_reached() -> None:
    step, request, _ = make_step(max_tokens=8, stop=("a",), min_tokens=1)
    first, _ = next_(step, request, row("a"))
    assert first.text == "a" and first.finish_reason is None  # the first token: not yet
    second, _ = next_(step, request, row("a"))
    assert second.finish_reason is FinishReason.STOP and second.text == ""


def test_end_of_generation_stops_the_branch_and_keeps_no_token() -> None:
    step, request, _ = make_step(max_tokens=8)
    next_(step, request, row("c"))
    delta, ops = next_(step, request, row(eos_first=True))
    assert delta == ChoiceDelta(0, "", [], FinishReason.STOP, None, newest_has_no_cell=False)
    assert ops == [] and request.branches[0].tokens == [tok("c")]
    assert step.drawn == 2  # drawn, not kept: still counted


def test_max_tokens_ends_the_branch_with_its_last_token_and_the_text_it_held() -> None:
    step, request, _ = make_step(max_tokens=2, stop=("ab",))
    next_(step, request, row("x"))
    delta, ops = next_(step, request, row("a"))
    # "a" was held for the stop "ab", which can no longer come: it goes out at the end
    assert delta == ChoiceDelta(0, "a", [tok("a")], FinishReason.LENGTH, None, True)
    assert ops == []


def test_max_tokens_zero_ends_at_once_without_drawing() -> None:
    step, request, sampler = make_step(max_tokens=0)
    delta, ops = next_(step, request, row("c"))
    assert delta == ChoiceDelta(0, "", [], FinishReason.LENGTH)
    assert ops == [] and sampler.draws == [] and step.drawn == 0


@pytest.mark.parametrize("params", [{"min_tokens": 2}, {"ignore_eos": True}])
def test_end_of_generation_is_masked_below_min_tokens_and_with_ignore_eos(
    params: dict[str, Any],
) -> None:
    step, request, sampler = make_step(max_tokens=4, **params)
    texts = [next_(step, request, row("c", eos_first=True))[0].text for _ in range(2)]
    assert texts == ["c", "c"]  # the row's most likely token, EOS, was masked
    assert all(EOS in d.forbidden for d in sampler.draws)
    third, _ = next_(step, request, row("c", eos_first=True))
    if "min_tokens" in params:  # reached: EOS may end it now
        assert third.finish_reason is FinishReason.STOP and EOS not in sampler.draws[-1].forbidden
    else:
        assert third.text == "c" and EOS in sampler.draws[-1].forbidden


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_a_complete_grammar_ends_the_branch_whatever_ignore_eos_says(ignore_eos: bool) -> None:
    step, request, _ = make_step([tok("a"), GRAMMAR_COMPLETE], max_tokens=8, ignore_eos=ignore_eos)
    assert next_(step, request, row(), mask="mask")[0].text == "a"
    delta, ops = next_(step, request, row(), mask="mask")
    assert delta == ChoiceDelta(0, "", [], FinishReason.STOP, None, newest_has_no_cell=False)
    assert ops == [] and step.drawn == 1  # nothing was drawn: the grammar said it all


def test_a_forced_token_is_kept_before_the_sampler_draws_and_the_sampler_is_told() -> None:
    step, request, sampler = make_step(max_tokens=8)
    request.branches[0].forced = [tok("x"), tok("y")]
    texts = [next_(step, request, row("c"))[0].text for _ in range(3)]
    assert texts == ["x", "y", "c"]  # the writer's words, then the model's
    assert sampler.accepted == [tok("x"), tok("y")] and len(sampler.draws) == 1


def test_the_grammars_mask_reaches_the_sampler() -> None:
    step, request, sampler = make_step(max_tokens=8)
    next_(step, request, row("c"), mask="its mask")
    assert sampler.draws[0].mask == "its mask"


# -- banned phrases: the four ways back --------------------------------------------------------


def test_a_phrase_begun_by_the_token_just_drawn_draws_again_from_the_same_row_NOW() -> None:
    step, request, sampler = make_step(max_tokens=8, banned_strings=("c",))
    next_(step, request, row("a"))
    the_row = row("cd")
    delta, ops = next_(step, request, the_row)
    assert ops == []  # nothing of it reached the cache
    assert delta == ChoiceDelta(0, "d", [tok("d")], None, None, newest_has_no_cell=True)
    branch = request.branches[0]
    assert branch.tokens == [tok("a"), tok("d")]
    assert branch.bans is not None and branch.bans.at(1) == [tok("c")]
    assert sampler.rewinds == [[tok("a")]]  # its memory: the tokens kept
    redraw = sampler.draws[-1]
    assert tok("c") in redraw.forbidden and np.array_equal(redraw.logits, the_row.logits)
    assert step.drawn == 3


def test_a_phrase_begun_at_the_branchs_first_token_draws_again_from_the_prompts_row_FIRST() -> None:
    step, request, sampler = make_step(max_tokens=8, banned_strings=("ab",), logprobs=1)
    first_row = row("ac")
    step.fork(request, first_row)  # the prompt's last row, kept for this
    assert request.first_row is not None
    held, _ = next_(step, request, first_row)
    assert held.text == "" and held.token_ids == []  # "a" may begin "ab": held, with its token
    delta, ops = next_(step, request, row("b"))
    assert ops == [KvOp.remove(SEQ, P)]  # the cells from the first token's on
    assert delta.text == "c" and delta.token_ids == [tok("c")] and delta.newest_has_no_cell
    branch = request.branches[0]
    assert branch.tokens == [tok("c")] and sampler.rewinds == [[]]
    assert branch.bans is not None and branch.bans.at(0) == [tok("a")]
    assert np.array_equal(sampler.draws[-1].logits, first_row.logits)
    assert tok("a") in sampler.draws[-1].forbidden
    # its score is read from the prompt's row, not from the row the phrase was found in
    (score,) = branch.scores
    assert score.token == tok("c") and score.logprob == pytest.approx(-1 - logsumexp(first_row))
    assert delta.logprobs == [score]


def test_a_rewind_to_the_start_of_a_constrained_branch_draws_with_the_grammars_first_mask() -> None:
    masks = Masks()
    step, request, sampler = make_step(max_tokens=8, banned_strings=("ab",), masks=masks)
    sampler.matcher = "matcher"
    step.fork(request, row("ac"))
    next_(step, request, row("ac"), mask="mask at 0")
    next_(step, request, row("b"), mask="mask at 1")
    assert masks.filled == [["matcher"]]
    assert [d.mask for d in sampler.draws] == ["mask at 0", "mask at 1", "first mask of matcher"]


def test_a_phrase_begun_earlier_rewinds_to_a_token_decoded_again_LATER() -> None:
    step, request, sampler = make_step(max_tokens=8, banned_strings=("bc",))
    assert next_(step, request, row("a"))[0].text == "a"
    assert next_(step, request, row("b"))[0].text == ""  # may begin "bc": held
    delta, ops = next_(step, request, row("c"))
    # Position 1's row is gone: token 0 ("a", its cell at P) is decoded again next step.
    assert ops == [KvOp.remove(SEQ, P)]
    assert delta == ChoiceDelta(0)  # nothing yet, and no new token without a cell
    branch = request.branches[0]
    assert branch.tokens == [tok("a")] and sampler.rewinds == [[tok("a")]]
    assert branch.bans is not None and branch.bans.at(1) == [tok("b")]
    # The next step's row is position 1's again: "b" is banned there.
    again, ops = next_(step, request, row("bd"))
    assert ops == [] and again.text == "d" and spell(branch.tokens) == "ad"


@pytest.mark.parametrize("bound", ["rewinds", "bans at one position"])
def test_a_bound_reached_ends_the_branch_before_the_phrase_END(bound: str) -> None:
    step, request, sampler = make_step(max_tokens=8, banned_strings=("bc",))
    branch = request.branches[0]
    assert branch.bans is not None
    next_(step, request, row("a"))
    next_(step, request, row("b"))
    if bound == "rewinds":
        branch.bans.rewinds = MAX_REWINDS
    else:
        branch.bans.bans[1] = [tok("z")] * MAX_BANS_PER_POSITION
    delta, ops = next_(step, request, row("c"))
    # The cells of "b" (decoded this step) go; "a" keeps its cell: the branch ends after it.
    assert ops == [KvOp.remove(SEQ, P + 1)]
    assert delta == ChoiceDelta(0, "", [], FinishReason.STOP, None, newest_has_no_cell=False)
    assert branch.tokens == [tok("a")] and sampler.rewinds == []


def test_a_bound_reached_on_the_token_just_drawn_ends_without_a_kv_change_END() -> None:
    step, request, _ = make_step(max_tokens=8, banned_strings=("b",))
    branch = request.branches[0]
    assert branch.bans is not None
    branch.bans.rewinds = MAX_REWINDS
    next_(step, request, row("a"))
    delta, ops = next_(step, request, row("b"))
    assert ops == [] and delta.finish_reason is FinishReason.STOP and branch.tokens == [tok("a")]


def test_a_pattern_that_matches_only_at_the_end_takes_back_end_of_generation() -> None:
    step, request, _ = make_step(max_tokens=8, banned_regex=(r"b\b",))
    next_(step, request, row("a"))
    next_(step, request, row("b"))  # "ab" goes on: no match while a letter may follow
    delta, ops = next_(step, request, row(eos_first=True))
    # The end would make "b" a match: back to before it. Every token had its cell, and
    # position 1's row is gone: token 0 is decoded again.
    assert ops == [KvOp.remove(SEQ, P)] and delta == ChoiceDelta(0)
    assert request.branches[0].tokens == [tok("a")]


def test_a_pattern_is_judged_at_the_real_end_on_the_last_token() -> None:
    step, request, _ = make_step(max_tokens=2, banned_regex=(r"b\b",))
    next_(step, request, row("a"))
    delta, ops = next_(step, request, row("bc"))  # "b" would end the text: a match
    assert ops == [] and delta.finish_reason is FinishReason.LENGTH
    assert delta.text == "c" and spell(request.branches[0].tokens) == "ac"


# -- distinct openings and scores ------------------------------------------------------------


def test_distinct_openings_draw_tokens_no_branch_before_took() -> None:
    step, request, _ = make_step(n=3, max_tokens=8, distinct_openings=True)
    the_row, taken = row("abc"), set[int]()
    texts = [next_(step, request, the_row, i, taken=taken)[0].text for i in range(3)]
    assert texts == ["a", "b", "c"] and taken == {tok("a"), tok("b"), tok("c")}
    samplers = [b.sampler for b in request.branches]
    assert [s.draws[0].taken for s in samplers if isinstance(s, Sampler)] == [
        set(),
        {tok("a")},
        {tok("a"), tok("b")},
    ]


def logsumexp(the_row: Row) -> float:
    return math.log(float(np.exp(the_row.logits.astype(np.float64)).sum()))


def test_logprobs_are_recorded_and_go_out_with_their_tokens() -> None:
    step, request, _ = make_step(max_tokens=8, logprobs=2)
    the_row = row("cd")
    scores = scores_of(request, the_row)
    assert scores is not None
    delta, _ = next_(step, request, the_row, scores=scores)
    (score,) = request.branches[0].scores
    assert score.token == tok("c") and score.logprob == pytest.approx(-logsumexp(the_row))
    assert [t for t, _ in score.top] == [tok("c"), tok("d")]
    assert delta.logprobs == [score]


def test_best_of_scores_every_token_without_sending_logprobs() -> None:
    step, request, _ = make_step(max_tokens=8)
    assert scores_of(request, row("c")) is None  # neither asked: no pass over the row

    class Keep:
        def collect(self, request: Request, choices: list[Any]) -> list[Any]:
            return choices

    request.best_of = Keep()
    the_row = row("c")
    delta, _ = next_(step, request, the_row)
    assert delta.logprobs is None and len(request.branches[0].scores) == 1
