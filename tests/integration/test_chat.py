"""POST /v1/chat/completions through the official SDK: n choices from one prefill."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.integration.bundled import GEMMA, ModelFacts
from tests.integration.conftest import CHAT_TEMPLATE
from tests.support.paths import assert_same_greedy, chat_steps, completion_steps
from tests.support.server import RunningServer

HELLO = [{"role": "user", "content": "Write one short sentence about the sea."}]


@pytest.fixture
def client(chat_server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=chat_server.api_url, api_key="unused", max_retries=0)


@pytest.fixture
def model(chat_server: RunningServer) -> str:
    return chat_server.model_id


def test_chat_with_n3(client: openai.OpenAI, model: str) -> None:
    out = client.chat.completions.create(model=model, messages=HELLO, n=3, max_tokens=8, seed=5)
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    assert [c.index for c in out.choices] == [0, 1, 2]
    for choice in out.choices:
        assert choice.message.role == "assistant" and choice.message.content
        assert choice.finish_reason in ("stop", "length")
        assert choice.logprobs is None
    assert out.usage is not None and out.usage.completion_tokens <= 3 * 8
    assert len({c.message.content for c in out.choices}) > 1  # seeds seed+i differ


def test_streaming_chat_with_n3_role_then_content_then_finish(
    client: openai.OpenAI, model: str
) -> None:
    stream = client.chat.completions.create(
        model=model,
        messages=HELLO,
        n=3,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    events: dict[int, list[str]] = {0: [], 1: [], 2: []}
    texts = {0: "", 1: "", 2: ""}
    usage = None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        usage = chunk.usage or usage
        for c in chunk.choices:
            if c.delta.role:
                events[c.index].append("role")
            if c.delta.content:
                events[c.index].append("content")
                texts[c.index] += c.delta.content
            if c.finish_reason:
                events[c.index].append(c.finish_reason)
    for index, seen in events.items():
        assert seen[0] == "role" and seen[-1] in ("stop", "length"), seen
        assert set(seen[1:-1]) <= {"content"} and texts[index]
    assert usage is not None and 0 < usage.completion_tokens <= 18


def test_greedy_chat_is_the_completion_of_the_rendered_template(
    client: openai.OpenAI, chat_server: RunningServer, model: str, model_facts: ModelFacts
) -> None:
    """The template's text, sent as a completion prompt, is the same prompt token for token
    (a BOS where the model wants one, added once) and so gets the same greedy reply."""
    chat = client.chat.completions.create(
        model=model, messages=HELLO, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2
    )
    prompt = model_facts.chat_prompt(HELLO[0]["content"])
    raw = httpx.post(
        f"{chat_server.api_url}/completions",
        json={"prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 2},
        timeout=60,
    ).json()
    # The second reads the prompt from the cache: the same text up to a near tie.
    assert_same_greedy(
        chat_steps(chat.choices[0].model_dump()), completion_steps(raw["choices"][0])
    )
    assert chat.usage is not None and chat.usage.prompt_tokens == raw["usage"]["prompt_tokens"]


def test_content_parts_and_max_completion_tokens(client: openai.OpenAI, model: str) -> None:
    parts = [{"type": "text", "text": "Write one short sentence"}, {"type": "text", "text": "now."}]
    out = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": parts},
        ],
        n=2,
        max_completion_tokens=3,
        extra_body={"ignore_eos": True},
    )
    assert all(c.finish_reason == "length" for c in out.choices)
    assert out.usage is not None and out.usage.completion_tokens == 6


def test_end_of_turn_ends_with_stop_and_is_never_shown(
    client: openai.OpenAI, chat_server: RunningServer, model: str, model_facts: ModelFacts
) -> None:
    end = model_facts.end_of_turn
    tokens = httpx.post(f"{chat_server.base_url}/tokenize", json={"content": end}).json()["tokens"]
    assert len(tokens) == 1  # one special token, an end-of-generation one
    # Bias makes the end of turn certain as soon as min_tokens allows it.
    out = client.chat.completions.create(
        model=model,
        messages=HELLO,
        n=2,
        max_tokens=10,
        logit_bias={str(tokens[0]): 100},
        extra_body={"min_tokens": 2},
    )
    for choice in out.choices:
        assert choice.finish_reason == "stop"
        assert choice.message.content and end not in choice.message.content
    assert out.usage is not None and out.usage.completion_tokens == 4  # 2 each, the end unseen


def test_chat_logprobs(client: openai.OpenAI, model: str) -> None:
    out = client.chat.completions.create(
        model=model,
        messages=HELLO,
        n=2,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    for choice in out.choices:
        assert choice.logprobs is not None and choice.logprobs.content is not None
        content = choice.logprobs.content
        assert "".join(t.token for t in content) == choice.message.content
        for token in content:
            assert bytes(token.bytes or []).decode() == token.token
            tops = [t.logprob for t in token.top_logprobs]
            assert len(tops) == 3 and tops == sorted(tops, reverse=True)
            assert tops[0] == pytest.approx(token.logprob)  # greedy took the most likely
            assert sum(2.718281828**lp for lp in tops) <= 1.0 + 1e-6


def test_each_bundled_model_chats_out_of_the_box(
    server: RunningServer, model_facts: ModelFacts
) -> None:
    """Gemma 3 270M base has no chat template in its GGUF: the server ships Gemma 3's (the
    file the unit tests check it against); SmolLM2's GGUF has its own ChatML one."""
    body = {"messages": HELLO, "max_tokens": 4}
    response = httpx.post(f"{server.api_url}/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert f"chat template: {model_facts.template_source}" in server.log()
    props = httpx.get(f"{server.base_url}/props").json()
    if model_facts.name == GEMMA:
        assert props["chat_template"] == CHAT_TEMPLATE.read_text()


@pytest.mark.models(GEMMA)
def test_turns_a_template_refuses_are_folded_into_ones_it_takes(
    chat_server: RunningServer,
) -> None:
    """Gemma 3's template refuses two user turns in a row (raise_exception); they are
    joined into one (input/turns.py), so the same prompt as the joined turn is read.
    Gemma 3 only: SmolLM2's ChatML template renders any order of turns as sent."""
    two_users = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    joined = [{"role": "user", "content": "a\n\nb"}]
    usage = []
    for messages in (two_users, joined):
        body = {"messages": messages, "max_tokens": 2}
        response = httpx.post(f"{chat_server.api_url}/chat/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        usage.append(response.json()["usage"]["prompt_tokens"])
    assert usage[0] == usage[1]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"messages": [{"role": "tool", "content": "a"}]}, "messages.0.role", "system"),
        ({"messages": []}, "messages", "at least 1"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages.0.content",
            "text parts",
        ),
        ({"messages": HELLO, "top_logprobs": 2}, "top_logprobs", "logprobs: true"),
        ({"messages": HELLO, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "[0, 20]"),
    ],
)
def test_bad_chat_requests_are_4xx_with_a_reason(
    chat_server: RunningServer, body: dict, param: str, words: str
) -> None:
    response = httpx.post(
        f"{chat_server.api_url}/chat/completions", json={"max_tokens": 2, **body}, timeout=60
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error
