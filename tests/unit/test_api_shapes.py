"""Pure pieces of the API layer: logprob shapes, chat messages, defaults, merged streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from pydantic import ValidationError

from llama_srb.api.input.chat import chat_params
from llama_srb.api.input.native import native_params
from llama_srb.api.input.params import DEFAULT_MAX_TOKENS_CAP, default_max_tokens
from llama_srb.api.render.logprobs import chat_logprobs, completion_logprobs
from llama_srb.api.schemas.chat import ChatMessage, ChatRequest
from llama_srb.api.schemas.completions import CompletionRequest
from llama_srb.api.schemas.native import NativeCompletionRequest
from llama_srb.api.service import merge
from llama_srb.engine.outputs import RequestOutput, RequestTimes
from llama_srb.engine.spec import RequestSpec
from llama_srb.sampling.logprobs import TokenLogprob
from tests.unit.fake_context import BOS, FakeModel

PIECES = {1: b"Hello", 2: b" world", 3: b"!", 4: "é".encode()[:1]}


def piece(token: int) -> bytes:
    return PIECES[token]


def test_completion_logprobs_offsets_and_top_include_the_chosen_token() -> None:
    entries = [
        (1, None),  # a prompt's first token: no logprob
        (2, TokenLogprob(2, -0.5, ((3, -0.2), (1, -2.0)))),
    ]
    out, end = completion_logprobs(entries, piece, offset=10)
    assert out.tokens == ["Hello", " world"]
    assert out.text_offset == [10, 15]
    assert end == 21
    assert out.token_logprobs == [None, -0.5]
    assert out.top_logprobs == [None, {"!": -0.2, "Hello": -2.0, " world": -0.5}]


def test_chat_logprobs_carry_bytes_even_of_partial_characters() -> None:
    (entry,) = chat_logprobs([TokenLogprob(4, -1.0, ((1, -0.1),))], piece)
    assert entry.bytes == [0xC3] and entry.token == "\ufffd"
    assert entry.top_logprobs[0].token == "Hello" and entry.top_logprobs[0].logprob == -0.1


def test_chat_content_parts_become_text() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert ChatMessage(role="user", content=parts).content == "a\nb"  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="text parts"):
        ChatMessage.model_validate({"role": "user", "content": [{"type": "image_url"}]})


@pytest.mark.parametrize("prompt", ["x", ["x", "y"], [1, 2], [[1, 2], [3]], []])
def test_prompt_shapes_accepted(prompt: object) -> None:
    assert CompletionRequest.model_validate({"prompt": prompt}).prompt == prompt


@pytest.mark.parametrize("prompt", [42, ["x", 1], [[1], "x"], [True], [1.5], {"a": 1}])
def test_prompt_shapes_refused(prompt: object) -> None:
    with pytest.raises(ValidationError, match="prompt must be"):
        CompletionRequest.model_validate({"prompt": prompt})


def test_default_max_tokens_is_what_fits_shared_by_n_and_capped() -> None:
    assert default_max_tokens(n_ctx=1000, prompt_len=100, n_branches=3) == 300
    assert default_max_tokens(n_ctx=1 << 20, prompt_len=100, n_branches=1) == DEFAULT_MAX_TOKENS_CAP
    assert default_max_tokens(n_ctx=100, prompt_len=100, n_branches=2) == 1  # → context error later


@pytest.mark.parametrize(
    ("choices_params", "branches"),
    [
        (None, 1),  # greedy: one branch decoded for all n choices (engine/spec.py)
        ([{}], 1),  # an entry that sets nothing is no choice's own setting
        ([{}, {"top_k": 4}], 4),  # a choice of its own: every branch decoded
    ],
)
def test_the_default_length_is_shared_by_the_branches_the_spec_decodes(
    choices_params: list[dict[str, object]] | None, branches: int
) -> None:
    """The branch count is decided once (engine/spec.py `branch_count` on the parameters):
    the length a request gets when it does not say is what fits beside its prompt, shared
    by the branches its spec will decode, for every route that sizes it."""
    model, n_ctx, prompt = FakeModel(), 1000, [BOS] * 100
    fields = {"n": 4, "temperature": 0, "top_k": 8, "choices_params": choices_params}
    native = NativeCompletionRequest.model_validate({"prompt": prompt, **fields})
    chat = ChatRequest.model_validate({"messages": [{"role": "user", "content": "x"}], **fields})
    for params in (
        native_params(native, model, n_ctx, len(prompt)),  # type: ignore[arg-type]
        chat_params(chat, model, len(prompt), n_ctx),  # type: ignore[arg-type]
    ):
        assert RequestSpec(prompt, params, 4).n_branches == branches
        assert params.max_tokens == default_max_tokens(n_ctx, len(prompt), branches)
        assert params.max_tokens == 900 // branches


def output(tag: int) -> RequestOutput:
    return RequestOutput(str(tag), [], 1, tag, 0, RequestTimes(0.0))


def test_merge_tags_outputs_with_their_stream_and_closes_all_when_left() -> None:
    closed: list[int] = []

    async def stream(tag: int, count: int) -> AsyncIterator[RequestOutput]:
        try:
            for _ in range(count):
                await asyncio.sleep(0)
                yield output(tag)
            await asyncio.sleep(10)  # a request that would go on generating
        finally:
            closed.append(tag)

    async def main() -> list[tuple[int, int]]:
        seen = []
        merged = merge([stream(0, 2), stream(1, 3)])
        async for position, out in merged:
            seen.append((position, out.prompt_tokens))
            if len(seen) == 5:
                break
        await merged.aclose()  # type: ignore[attr-defined]
        return seen

    seen = asyncio.run(main())
    assert sorted(seen) == [(0, 0), (0, 0), (1, 1), (1, 1), (1, 1)]
    assert sorted(closed) == [0, 1]  # leaving early cancels every stream
