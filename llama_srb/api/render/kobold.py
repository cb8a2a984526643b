"""Engine outputs → KoboldCpp's answers, with its field names and types (koboldcpp.py:
`generate_text`, `handle_sse_stream`, `parse_last_logprobs`).

- /api/v1/generate: `{"results": [{"text", "finish_reason", "logprobs", "prompt_tokens",
  "completion_tokens"}]}`, one result per branch (KoboldAI's API carries `n` there).
- /api/extra/generate/stream: `event: message` / `data: {"token", "finish_reason"}`
  events, `finish_reason` the string "null" until the last one, as KoboldCpp sends it;
  the stream carries one text, so `n` is 1 there.
- /api/extra/generate/check: each branch's text so far.

KoboldCpp keeps the stop sequence in the text unless `trim_stop`: it is put back here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from llama_srb.api.errors import KOBOLD_PREFIX, api_error
from llama_srb.api.render.logprobs import TokenText
from llama_srb.api.render.native import stop_info
from llama_srb.api.render.sse import guarded, named_event
from llama_srb.engine.outputs import ChoiceSoFar, FinishReason, RequestOutput
from llama_srb.sampling.logprobs import TokenLogprob

RUNNING = "null"  # KoboldCpp's finish_reason while a stream runs: the string


@dataclass
class KoboldCall:
    """One generate call (one prompt, `n` branches), rendered either way."""

    n: int
    stops: Sequence[str]
    trim_stop: bool
    logprobs: bool
    vocab: TokenText
    results: list[ChoiceSoFar] = field(init=False)
    prompt_tokens: int = 0

    def __post_init__(self) -> None:
        self.results = [ChoiceSoFar(i) for i in range(self.n)]

    def _add(self, out: RequestOutput) -> None:
        if out.error is not None:
            raise api_error(out)
        self.prompt_tokens = out.prompt_tokens
        for delta in out.choices:
            self.results[delta.index].add(delta, 0.0)

    async def collect(self, outputs: AsyncIterator[tuple[int, RequestOutput]]) -> dict[str, Any]:
        """The whole answer, once every output is in."""
        async for _, out in outputs:
            self._add(out)
        return self.whole()

    def whole(self) -> dict[str, Any]:
        """The answer of /api/v1/generate (what was generated, if it was aborted)."""
        return {"results": [self._result(r) for r in self.results]}

    def pending(self) -> dict[str, Any]:
        """The answer of /api/extra/generate/check: each branch's text so far."""
        return {"results": [{"text": r.text} for r in self.results]}

    def events(self, outputs: AsyncIterator[tuple[int, RequestOutput]]) -> AsyncIterator[str]:
        """`event: message` events; a failed call ends with an error event in KoboldCpp's
        shape, as its whole answer would be (errors.kobold_error_body)."""
        return guarded(self._stream(outputs), end="", path=KOBOLD_PREFIX)

    async def _stream(
        self, outputs: AsyncIterator[tuple[int, RequestOutput]]
    ) -> AsyncIterator[str]:
        result = self.results[0]
        async for _, out in outputs:
            self._add(out)
            for delta in out.choices:
                ended = delta.finish_reason is not None
                if delta.text or ended:
                    token = delta.text + (self._kept_stop(result) if ended else "")
                    reason = _reason(result.finish_reason) if ended else RUNNING
                    yield named_event("message", {"token": token, "finish_reason": reason})

    def _result(self, result: ChoiceSoFar) -> dict[str, Any]:
        return {
            "text": result.text + self._kept_stop(result),
            "finish_reason": _reason(result.finish_reason),
            "logprobs": self._logprobs(result.logprobs) if self.logprobs else None,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": len(result.token_ids),
        }

    def _kept_stop(self, result: ChoiceSoFar) -> str:
        if self.trim_stop or result.finish_reason is not FinishReason.STOP:
            return ""
        kind, word = stop_info(result, self.stops, self.vocab.text)
        return word if kind == "word" else ""

    def _logprobs(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        """parse_last_logprobs: OpenAI's chat form (`content`) and its completions form
        (`tokens`, `token_logprobs`, `top_logprobs` as dicts, `text_offset`) together."""
        body: dict[str, list[Any]] = {
            key: [] for key in ("content", "tokens", "token_logprobs", "top_logprobs")
        }
        offsets, offset = [], 0
        for entry in entries:
            token = self._text(entry.token)
            tops = [(self._text(t), lp) for t, lp in entry.top]
            body["content"].append(
                {
                    "token": token,
                    "logprob": entry.logprob,
                    "bytes": list(token.encode()),
                    "top_logprobs": [
                        {"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in tops
                    ],
                }
            )
            body["tokens"].append(token)
            body["token_logprobs"].append(entry.logprob)
            body["top_logprobs"].append(dict(tops))
            offsets.append(offset)
            offset += len(token)
        return {**body, "text_offset": offsets}

    def _text(self, token: int) -> str:
        return self.vocab.piece(token).decode("utf-8", errors="ignore")


def _reason(reason: FinishReason | None) -> str:
    """KoboldCpp's two reasons, and "abort" for a generation stopped by /api/extra/abort
    (or its client), so its own stream says so instead of "length"."""
    if reason is FinishReason.ABORT:
        return "abort"
    return "stop" if reason is FinishReason.STOP else "length"
