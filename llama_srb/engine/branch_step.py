"""One branch's step: its next token from its logits row, the token's text, and the delta
that goes out; a token that began a banned phrase is taken back first.

The only writer of a branch's tokens, scores and text (the scheduler owns its status and
KV state). It never calls llama.cpp's KV cache: what a rewind must remove there comes
back as KvOps, which the engine applies before the branch is decoded again. Tested from a
logits row alone (tests/unit/test_branch_step.py).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import numpy as np

from llama_srb.engine.kv import KvOp
from llama_srb.engine.outputs import ChoiceDelta, FinishReason
from llama_srb.engine.request import Branch, Request
from llama_srb.sampling.constraint import GRAMMAR_COMPLETE
from llama_srb.sampling.cut import Row
from llama_srb.sampling.device_row import DeviceRow
from llama_srb.sampling.logprobs import RowScores
from llama_srb.sampling.masks import Bitmask, MaskBatch


class Rewind(enum.Enum):
    """What a branch does after a banned phrase took it back (BranchStep._rewind)."""

    NOW = "now"  # draw again from this step's row
    FIRST = "first"  # back to its start: draw again from the prompt's last row, kept
    LATER = "later"  # its last kept token is decoded again first
    END = "end"  # a bound was reached: it ends before the phrase


class Drawn(NamedTuple):
    """What a branch drew this step: the text it released, and why it ends (if it does).
    (A tuple: built once per branch-step, where a frozen dataclass costs ~3x more.)"""

    text: str = ""
    reason: FinishReason | None = None
    newest_has_no_cell: bool = False  # it kept a token this step, decoded next step


def scores_of(request: Request, row: Row | DeviceRow) -> RowScores | None:
    """The row's normalizer and top alternatives, when the request reads logprobs (or
    ranks its branches: best_of); read before any sampler changes the row. (A request
    that reads them is never served a device's candidates: engine/device_cut.py.)"""
    if not request.scores_tokens:  # the common case: no pass over the row for them
        return None
    assert isinstance(row, Row), "logprobs read the whole row"
    return RowScores(row, request.params.logprobs or 0)


class BranchStep:
    """`eog_tokens`: the model's end-of-generation tokens. `masks`: for a grammar's first
    mask again, after a rewind to a branch's start."""

    def __init__(self, eog_tokens: tuple[int, ...], masks: MaskBatch) -> None:
        self._eog = np.unique(np.array(eog_tokens, dtype=np.int64))
        self._eog_set = frozenset(eog_tokens)  # per-token check without numpy
        self._masks = masks
        self.drawn = 0  # tokens drawn, kept or taken back: what the engine reports

    def fork(self, request: Request, row: Row | DeviceRow) -> None:
        """The prompt's last row, before its branches sample their first tokens."""
        if request.params.bans_text:  # kept for rewinds to a branch's start
            assert isinstance(row, Row), "banned phrases read the whole row"
            request.first_row = (row.logits.copy(), row.colmax.copy())

    def next(
        self,
        request: Request,
        branch: Branch,
        row: Row | DeviceRow | None,
        scores: RowScores | None,
        taken: set[int] | None = None,
        mask: Bitmask | None = None,
        picked: int | None = None,
    ) -> tuple[ChoiceDelta, list[KvOp]]:
        """The branch's delta for this step, and the KV changes a rewind needs. A finish
        reason when the branch ends here (the scheduler then releases it). With `taken`
        (distinct openings), a first token none of the branches before it drew. `picked`:
        the token its sampler drew and accepted already (no `row`: the device's candidates
        decided it, engine/device_cut.py)."""
        assert branch.text is not None
        released = branch.text.released
        ops: list[KvOp] = []
        if request.params.max_tokens == 0:
            drawn: Drawn | None = Drawn(reason=FinishReason.LENGTH)
        else:
            drawn = self._draw(request, branch, row, scores, taken, mask, ops, picked)
        if drawn is None:  # rewound to a token decoded again next step: nothing yet
            return ChoiceDelta(branch.index), ops
        return self._delta(request, branch, released, drawn), ops

    def _draw(
        self,
        request: Request,
        branch: Branch,
        row: Row | DeviceRow | None,
        scores: RowScores | None,
        taken: set[int] | None,
        mask: Bitmask | None,
        ops: list[KvOp],
        picked: int | None = None,
    ) -> Drawn | None:
        """Sample until a token stays (or the branch ends): one that began a banned phrase
        is taken back and drawn again from the same row when it can be."""
        params = request.params
        assert branch.text is not None
        mask_eog = request.masks_end(branch)
        while True:
            if picked is not None:
                token, picked = picked, None
            elif branch.forced:  # the writer's next word (live branching's `append`)
                token = branch.forced.pop(0)
                assert branch.sampler is not None
                branch.sampler.accept(token)
            else:
                assert row is not None
                token = self._pick(branch, row, mask_eog, taken, mask)
            if token == GRAMMAR_COMPLETE:  # nothing may follow: the branch has said it all
                return Drawn(reason=FinishReason.STOP)
            self.drawn += 1
            if token in self._eog_set:
                # a banned pattern may match only where the text ends (`\bthe\b`)
                if branch.text.end_banned_at() is None:
                    return Drawn(reason=FinishReason.STOP)
                rewind = self._rewind(request, branch, ops, newest_has_cell=True)
            else:
                branch.tokens.append(token)
                if scores is not None:
                    branch.scores.append(scores.entry(token))
                final = len(branch.tokens) >= params.max_tokens
                text = branch.text.push(
                    token, check_stops=len(branch.tokens) > params.min_tokens, final=final
                )
                if branch.text.banned_at is None:
                    reason = None
                    if branch.text.stopped:
                        reason = FinishReason.STOP
                    elif final:
                        reason = FinishReason.LENGTH
                    return Drawn(text, reason, newest_has_no_cell=True)
                rewind = self._rewind(request, branch, ops)
            if rewind is Rewind.END:
                return Drawn(reason=FinishReason.STOP)
            if rewind is Rewind.LATER:
                return None
            if rewind is Rewind.FIRST:
                row = self._first_row(request)
                scores = scores_of(request, row)
                if mask is not None:  # the grammar is back at its start: its first mask
                    assert branch.sampler is not None and branch.sampler.matcher is not None
                    mask = self._masks.fill([branch.sampler.matcher])[0]

    def _pick(
        self,
        branch: Branch,
        row: Row | DeviceRow,
        mask_eog: bool,
        taken: set[int] | None,
        mask: Bitmask | None,
    ) -> int:
        """The branch's sampler's token from `row`, never one banned at this position nor
        (masked) end-of-generation; for a distinct opening, not one in `taken`, which it
        joins."""
        assert branch.sampler is not None
        banned = branch.bans.at(len(branch.tokens)) if branch.bans is not None else None
        # candidates with no end-of-generation token among them need no mask of them
        forbidden = self._eog if mask_eog and row.eog else None
        if banned:
            ids = np.asarray(banned, dtype=np.int64)
            forbidden = np.unique(ids if forbidden is None else np.concatenate([forbidden, ids]))
        token = branch.sampler.sample(row, forbidden, taken, mask)
        if taken is not None:
            taken.add(token)
        return token

    @staticmethod
    def _rewind(
        request: Request, branch: Branch, ops: list[KvOp], newest_has_cell: bool = False
    ) -> Rewind:
        """A banned phrase began in the branch's token k: take the branch back to before
        it, and ban that token at position k. Its KV cells from there go (`ops`), its
        sampler forgets what followed; its text was held back, so no reader saw any of it.
        `newest_has_cell`: no token was kept this step (it drew end-of-generation), so
        every token has its cell and this step's row is for the position after them."""
        assert branch.bans is not None and branch.text is not None
        assert branch.sampler is not None
        k = branch.text.banned_at
        assert k is not None
        # the newest token without a cell (sampled this step), or one past the last
        newest = len(branch.tokens) - (0 if newest_has_cell else 1)
        may_go_on = branch.bans.ban(k, branch.tokens[k])
        branch.text.rewind(k)
        del branch.tokens[k:], branch.scores[k:]
        if not may_go_on:  # bounds reached: the branch ends with the text before the phrase
            if k < newest:
                ops.append(KvOp.remove(branch.seq_id, request.prompt_len + k))
            return Rewind.END
        branch.sampler.rewind(branch.tokens)
        if k == newest:  # this step's row is position k's: draw again from it
            return Rewind.NOW
        if k == 0:  # the prompt's last row was kept (request.first_row): draw from it
            ops.append(KvOp.remove(branch.seq_id, request.prompt_len))
            return Rewind.FIRST
        # Position k's row is gone: the token before it is decoded again next step.
        ops.append(KvOp.remove(branch.seq_id, request.prompt_len + k - 1))
        return Rewind.LATER

    @staticmethod
    def _first_row(request: Request) -> Row:
        """A copy of the prompt's last row, to sample a branch's first token from again."""
        assert request.first_row is not None
        logits, maxima = request.first_row
        return Row(logits.copy(), maxima.copy())

    @staticmethod
    def _delta(request: Request, branch: Branch, released: int, drawn: Drawn) -> ChoiceDelta:
        """The branch's delta: the tokens its text stream let out since `released` (the
        count before this step), with their logprobs when the request asked; a branch
        that ends lets out the text it held back for a stop or a phrase that never came."""
        assert branch.text is not None
        text = drawn.text + (branch.text.flush() if drawn.reason is not None else "")
        end = branch.text.released
        tokens = branch.tokens[released:end]
        logprobs = (
            branch.scores[released:end] if tokens and request.params.logprobs is not None else None
        )
        return ChoiceDelta(
            branch.index, text, tokens, drawn.reason, logprobs, drawn.newest_has_no_cell
        )
