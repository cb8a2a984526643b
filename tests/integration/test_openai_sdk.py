"""The official `openai` SDK works unchanged against the server."""

from __future__ import annotations

import openai
import pytest

from tests.support.server import RunningServer


@pytest.fixture
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0)


def test_completions_with_n(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    out = client.completions.create(
        model=model,
        prompt="Once upon a time",
        n=3,
        max_tokens=8,
        seed=7,
        extra_body={"min_p": 0.1, "top_k": 20},
    )
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    assert out.usage is not None and out.usage.completion_tokens > 0


def test_streaming_completions_with_n(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model=client.models.list().data[0].id,
        prompt="Once upon a time",
        n=2,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts = {0: "", 1: ""}
    reasons = {}
    usage = None
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
        usage = chunk.usage or usage
    assert set(reasons) == {0, 1}
    assert all(texts.values())
    assert usage is not None and usage.prompt_tokens > 0


def test_sdk_raises_bad_request_for_bad_n(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=client.models.list().data[0].id, prompt="x", n=0)
