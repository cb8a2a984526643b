"""TokenLogprobs in the two shapes of OpenAI's API: completions' parallel lists, chat's list
of objects. Token ids become the text a client sees (special tokens: empty)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from llama_srb.api.schemas.chat import TokenLogprobOut, TopLogprob
from llama_srb.api.schemas.completions import CompletionLogprobs
from llama_srb.sampling.logprobs import TokenLogprob

Piece = Callable[[int], bytes]


class TokenText(Protocol):
    """What rendering needs of the model: a token's bytes, and tokens' text (native.Model)."""

    def piece(self, token: int) -> bytes: ...
    def text(self, tokens: Sequence[int]) -> str: ...


def token_str(piece: Piece, token: int) -> str:
    # A token may end inside a multi-byte character; its text then shows a replacement.
    return piece(token).decode("utf-8", errors="replace")


def completion_logprobs(
    entries: Sequence[tuple[int, TokenLogprob | None]], piece: Piece, offset: int
) -> tuple[CompletionLogprobs, int]:
    """Completions' `logprobs` for (token, entry) pairs whose text starts at `offset` of
    prompt + completion; also returns the offset after them. An entry is None where a
    token has no log-probability (the prompt's first)."""
    out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    for token, entry in entries:
        text = token_str(piece, token)
        out.tokens.append(text)
        out.text_offset.append(offset)
        offset += len(text)
        out.token_logprobs.append(entry.logprob if entry else None)
        out.top_logprobs.append(_top_dict(entry, piece) if entry else None)
    return out, offset


def _top_dict(entry: TokenLogprob, piece: Piece) -> dict[str, float]:
    # OpenAI's completions: the k most likely, plus the chosen token when it is not among them.
    top = {token_str(piece, t): logprob for t, logprob in entry.top}
    top.setdefault(token_str(piece, entry.token), entry.logprob)
    return top


def chat_logprobs(entries: Sequence[TokenLogprob], piece: Piece) -> list[TokenLogprobOut]:
    """Chat's `logprobs.content`: each token with its bytes and its top alternatives."""
    return [
        TokenLogprobOut(
            **_top(entry.token, entry.logprob, piece).model_dump(),
            top_logprobs=[_top(t, logprob, piece) for t, logprob in entry.top],
        )
        for entry in entries
    ]


def _top(token: int, logprob: float, piece: Piece) -> TopLogprob:
    raw = piece(token)
    return TopLogprob(token=raw.decode("utf-8", errors="replace"), logprob=logprob, bytes=list(raw))


def concat(head: CompletionLogprobs, tail: CompletionLogprobs) -> CompletionLogprobs:
    return CompletionLogprobs(
        tokens=head.tokens + tail.tokens,
        token_logprobs=head.token_logprobs + tail.token_logprobs,
        top_logprobs=head.top_logprobs + tail.top_logprobs,
        text_offset=head.text_offset + tail.text_offset,
    )
