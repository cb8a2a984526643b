"""Errors are owned by whoever caused them (issue 37): one mapping (errors.api_error) gives a
failure's status, type and code to the whole answer and to every renderer's stream alike,
so a request whose own constraint cannot go on is a client error either way; and a number
that is not finite is a 400 naming its field, wherever it is in a body."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from llama_srb.api.deps import INLINE_BODY_BYTES
from llama_srb.api.errors import APIError, api_error, body_for
from llama_srb.api.finite import non_finite
from llama_srb.api.input.prompts import Prompt
from llama_srb.api.render.chat import ChatAnswer
from llama_srb.api.render.completions import CompletionAnswer
from llama_srb.api.render.kobold import KoboldCall
from llama_srb.api.render.native import NativeCall, NativeOptions
from llama_srb.api.render.sse import error_event, guarded
from llama_srb.engine.generation import EngineDied, RequestTimedOut, ShuttingDown
from llama_srb.engine.outputs import ChoiceDelta, RequestOutput, RequestTimes
from llama_srb.sampling.params import ParamError, SamplingParams
from tests.unit.fake_context import FakeModel

REFUSAL = "the grammar cannot go on: lexer error: too many expressions constructed"


def output(error: str | None = None, refused: bool = False, text: str = "") -> RequestOutput:
    choices = [ChoiceDelta(0, text, [1] if text else [])] if text else []
    return RequestOutput(
        "cmpl-1", choices, 1, 3, len(choices), RequestTimes(0.0), error=error, refused=refused
    )


# -- the one mapping ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "status", "kind", "code"),
    [
        (output(REFUSAL, refused=True), 400, "invalid_request_error", "constraint_failed"),
        (output("engine error: decode failed"), 500, "server_error", "engine_error"),
        (RequestTimedOut("over the time limit"), 504, "timeout_error", "request_timeout"),
        (ShuttingDown("shutting down"), 503, "service_unavailable", "server_shutting_down"),
        (EngineDied("engine died"), 503, "service_unavailable", "engine_failed"),
        (ParamError("top_k", "top_k must be ≥ 0"), 400, "invalid_request_error", None),
        (APIError(429, "queue full", code="queue_full"), 429, "rate_limit_error", "queue_full"),
        (RuntimeError("a bug"), 500, "server_error", None),
    ],
)
def test_a_failure_s_status_type_and_code_are_the_same_whole_and_streamed(
    failure: RequestOutput | Exception, status: int, kind: str, code: str | None
) -> None:
    error = api_error(failure)
    assert (error.status, error.code) == (status, code)
    whole = body_for("/v1/completions", error.status, error.message, error.param, error.code)
    assert whole["error"]["type"] == kind
    line = error_event(failure)
    assert line.startswith("data: ") and line.endswith("\n\n")
    assert json.loads(line.removeprefix("data: ")) == whole


def test_kobold_s_stream_error_has_its_whole_answer_s_shape() -> None:
    line = error_event(output(REFUSAL, refused=True), "/api/extra/generate/stream")
    detail = json.loads(line.removeprefix("data: "))["detail"]
    assert detail == {"msg": REFUSAL, "type": "bad_input", "code": "constraint_failed"}


def test_guarded_ends_a_failed_stream_with_one_error_event_then_its_end() -> None:
    async def events() -> AsyncIterator[str]:
        yield "data: 1\n\n"
        raise api_error(output(REFUSAL, refused=True))

    async def read(end: str) -> list[str]:
        return [line async for line in guarded(events(), end=end)]

    lines = asyncio.run(read("data: [DONE]\n\n"))
    assert lines[0] == "data: 1\n\n" and lines[-1] == "data: [DONE]\n\n"
    assert json.loads(lines[1].removeprefix("data: "))["error"]["code"] == "constraint_failed"
    assert len(asyncio.run(read(""))) == 2  # llama.cpp's and KoboldCpp's streams just stop


# -- every renderer's stream ------------------------------------------------------------


def completions() -> Any:
    return CompletionAnswer("cmpl-1", 0, "m", False, 1, None, prompts=[Prompt([1, 2], "ab")])


def chat() -> Any:
    return ChatAnswer("chatcmpl-1", 0, "m", False, 1, None)


def native() -> Any:
    return NativeCall(
        NativeOptions("m", 1, stream=True), SamplingParams(), [Prompt([1], "a")], FakeModel()
    )


def kobold() -> Any:
    return KoboldCall(1, (), False, False, FakeModel())


RENDERERS: dict[str, tuple[Callable[[], Any], str, bool]] = {
    # name: the answer, where its error object is, whether `[DONE]` ends its stream
    "completions": (completions, "error", True),
    "chat": (chat, "error", True),
    "native": (native, "error", False),
    "kobold": (kobold, "detail", False),
}


async def merged(*outs: RequestOutput) -> AsyncIterator[tuple[int, RequestOutput]]:
    for out in outs:
        yield 0, out


def stream(answer: Any, *outs: RequestOutput) -> list[str]:
    async def read() -> list[str]:
        return [line async for line in answer.events(merged(*outs))]

    return asyncio.run(read())


def error_of(line: str) -> dict[str, Any]:
    data = next(part for part in line.split("\n") if part.startswith("data: "))
    payload: dict[str, Any] = json.loads(data.removeprefix("data: "))
    return payload


@pytest.mark.parametrize("name", list(RENDERERS))
def test_every_stream_s_constraint_failure_is_a_client_error(name: str) -> None:
    make, key, done = RENDERERS[name]
    lines = stream(make(), output(text="a"), output(REFUSAL, refused=True))
    if done:
        assert lines.pop() == "data: [DONE]\n\n"
    error = error_of(lines[-1])[key]
    assert error["type"] == ("bad_input" if key == "detail" else "invalid_request_error")
    assert error["code"] == "constraint_failed"
    assert REFUSAL in error.get("message", error.get("msg", ""))
    whole = api_error(output(REFUSAL, refused=True))
    with pytest.raises(APIError) as raised:  # the same call, not streamed
        asyncio.run(make().collect(merged(output(text="a"), output(REFUSAL, refused=True))))
    assert (
        (raised.value.status, raised.value.code)
        == (whole.status, whole.code)
        == (
            400,
            "constraint_failed",
        )
    )


@pytest.mark.parametrize("name", list(RENDERERS))
def test_every_stream_s_engine_failure_is_the_server_s(name: str) -> None:
    make, key, done = RENDERERS[name]
    lines = stream(make(), output("engine error: decode failed"))
    error = error_of(lines[-2] if done else lines[-1])[key]
    assert error["type"] == "server_error"


@pytest.mark.parametrize("name", list(RENDERERS))
def test_every_stream_interrupted_ends_with_the_runtime_s_error(name: str) -> None:
    make, key, done = RENDERERS[name]

    async def timed_out() -> AsyncIterator[tuple[int, RequestOutput]]:
        yield 0, output(text="a")
        raise RequestTimedOut("over the time limit")

    async def read() -> list[str]:
        return [line async for line in make().events(timed_out())]

    lines = asyncio.run(read())
    assert (lines[-1] == "data: [DONE]\n\n") == done
    error = error_of(lines[-2] if done else lines[-1])[key]
    assert error["type"] == ("timeout_error" if key == "error" else "server_error")
    assert error["code"] == "request_timeout"


# -- numbers that are not finite --------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "found"),
    [
        (b'{"temperature": NaN}', ("temperature", "NaN")),
        (b'{"nodes": [{"id": 1, "stats": {"x": 1e400}}]}', ("nodes[0].stats.x", "1e400")),
        (
            b'{"nodes": [{}, {"params": {"a": [1, {"b": -Infinity}]}}]}',
            ("nodes[1].params.a[1].b", "-Infinity"),
        ),
        (b'{"x": 1E+400}', ("x", "1E+400")),
        (b'{"x": ' + b"9" * 250 + b"e60}", ("x", "9" * 250 + "e60")),
        (b'{"x": ' + b"1" * 400 + b"}", ("x", "1" * 400)),
        (b'{"x": 1.7976931348623157e308, "y": -1e-400, "z": 1' + b"0" * 308 + b"}", None),
        (b'{"text": "NaN, Infinity and e400 are words here"}', None),
        (b"[Infinity]", ("[0]", "Infinity")),
        (b'{"x": NaN', None),  # not JSON: pydantic says why
    ],
)
def test_the_first_number_that_is_not_finite_is_found_with_its_path(
    raw: bytes, found: tuple[str, str] | None
) -> None:
    assert non_finite(raw) == found


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
@pytest.mark.parametrize(
    ("route", "body", "path", "read"),
    [
        ("/v1/completions", '{"prompt": "x", "temperature": %s}', "temperature", "error"),
        (
            "/v1/completions",
            '{"prompt": "x", "choices_params": [{}, {"top_p": %s}]}',
            "choices_params[1].top_p",
            "error",
        ),
        ("/completion", '{"prompt": "x", "min_p": %s}', "min_p", "error"),
        ("/api/v1/generate", '{"prompt": "x", "rep_pen": %s}', "rep_pen", "detail"),
    ],
)
@pytest.mark.parametrize("prompt", [1, INLINE_BODY_BYTES])  # parsed on the loop, on a worker
def test_a_number_that_is_not_finite_is_a_400_naming_its_field(
    client: TestClient, number: str, route: str, body: str, path: str, read: str, prompt: int
) -> None:
    content = (body % number).replace('"x"', f'"{"x" * prompt}"')
    response = client.post(route, content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()[read]
    message = error["message"] if read == "error" else error["msg"]
    assert f"`{path}`" in message and number in message
    if read == "error":
        assert error["param"] == path
