"""KoboldCpp's API: KoboldAI United's /api/v1 routes and KoboldCpp's /api/extra ones, as
KoboldCpp 1.76 serves them (koboldcpp.py `do_GET`, `do_POST`), for KoboldAI Lite, Mikupad's
KoboldCpp mode and the tools written against it. Same engine path and skeleton as every
generation route (routes/generate.py `respond`): the prompt evaluated once, its `n` results
decoded together (input/kobold.py → build_all → submit → render/kobold.py).

A `genkey` (KoboldAI Lite sends "KCPP" and four digits) lets /api/extra/generate/check read
a generation's text so far and /api/extra/abort stop it. KoboldCpp stops whatever runs when
the key is empty; here nothing is stopped or read without the key, and a key counts only
for the owner that started the generation (its API key's name; without keys, its address
and page origin), so one writer can neither stop nor read another's. Lite's four digits
are guessable: an owner that keeps asking for keys that are not running (20 a minute)
finds none of its own for a while. A generation sent without a genkey gets one made here,
128 random bits, in the answer's `X-Genkey` header. An aborted generation's own answer
says so (`finish_reason` "abort").
"""

from __future__ import annotations

import functools
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from llama_srb.api.clients import Caller, Owner, generation_owner
from llama_srb.api.deps import State, parsed
from llama_srb.api.errors import APIError
from llama_srb.api.input.kobold import kobold_budget, kobold_params, kobold_prompt
from llama_srb.api.input.params import build_all
from llama_srb.api.models import ModelSlot
from llama_srb.api.render.kobold import KoboldCall
from llama_srb.api.routes.generate import Prepared, respond
from llama_srb.api.routes.tokenize import tokens_of
from llama_srb.api.schemas.kobold import (
    DEFAULT_MAX_LENGTH,
    GenkeyRequest,
    KoboldGenerateRequest,
    TokenCountRequest,
)
from llama_srb.api.service import Merged
from llama_srb.api.state import AppState
from llama_srb.api.workers import body_spec
from llama_srb.engine.spec import RequestSpec

KOBOLDCPP_VERSION = "1.76"  # whose API this is: KoboldAI Lite turns features on by it
KOBOLDAI_API_VERSION = "1.2.5"  # the KoboldAI United API version KoboldCpp reports
MAX_GENKEY_BODY = 4096  # a check or abort body holds a key, nothing more
GENKEY_HEADER = "X-Genkey"  # the genkey made here for a generation sent without one
MISSES_PER_MINUTE = 20  # keys an owner may ask for that are not running, before it is cut off
MISS_WINDOW_S = 60.0


@dataclass
class Job:
    """A running generation that a genkey names."""

    owner: Owner
    request_ids: list[str] = field(default_factory=list)
    call: KoboldCall | None = None
    aborted: bool = False

    def submitting(self, prepared: Prepared) -> None:
        """Its requests are built and about to go (respond's hook, on the event loop): from
        now on /check reads its answer and /abort stops them; none goes if an abort came
        while they were built."""
        answer = prepared.answer
        assert isinstance(answer, Registered)
        self.call = answer.call
        if self.aborted:
            prepared.close()
            prepared.submissions = []
        self.request_ids = [s.request_id for s in prepared.submissions]


@dataclass
class Registered:
    """A generation's answer (render/kobold.py), its genkey released once it is over."""

    call: KoboldCall
    release: Callable[[], None]

    async def events(self, outputs: Merged) -> AsyncIterator[str]:
        try:
            async for line in self.call.events(outputs):
                yield line
        finally:
            self.release()

    async def collect(self, outputs: Merged) -> dict[str, Any]:
        try:
            return await self.call.collect(outputs)
        finally:
            self.release()


class GenKeys:
    """(owner, genkey) → its running generation; one owner: the router. A lookup sees only
    the asker's own generations, and none while the asker is guessing (too many misses)."""

    def __init__(self) -> None:
        self._jobs: dict[tuple[Owner, str], Job] = {}
        self._misses: dict[Owner, deque[float]] = {}

    def add(self, genkey: str, job: Job) -> None:
        self._jobs[job.owner, genkey] = job  # a key used again names the newest generation

    def remove(self, genkey: str, job: Job) -> None:
        if self._jobs.get((job.owner, genkey)) is job:
            del self._jobs[job.owner, genkey]

    def find(self, genkey: str, owner: Owner, now: float | None = None) -> Job | None:
        if not genkey:
            return None
        now = time.monotonic() if now is None else now
        misses = self._misses.get(owner, deque())
        while misses and misses[0] <= now - MISS_WINDOW_S:
            misses.popleft()
        if len(misses) >= MISSES_PER_MINUTE:
            return None  # guessing: not even its own keys count for now
        job = self._jobs.get((owner, genkey))
        if job is None:
            if len(self._misses) > 10_000:  # forget the owners that stopped missing
                fresh = now - MISS_WINDOW_S
                self._misses = {o: m for o, m in self._misses.items() if m and m[-1] > fresh}
            misses.append(now)
            self._misses[owner] = misses
        return job


async def genkey_of(http: Request) -> str:
    """The key of a check or abort body; none for an empty or unreadable one (KoboldCpp
    reads those as no key too; Mikupad and SillyTavern send no body)."""
    raw = await http.body()
    if not raw or len(raw) > MAX_GENKEY_BODY:
        return ""
    try:
        return GenkeyRequest.model_validate_json(raw).genkey
    except ValidationError:
        return ""


def kobold_router() -> APIRouter:
    """The routes, around the one registry of running generations by genkey."""
    router = APIRouter(prefix="/api")
    genkeys = GenKeys()

    def value(number: int) -> JSONResponse:
        return JSONResponse({"value": number})

    async def model_name(state: State) -> JSONResponse:
        return JSONResponse({"result": state.models.current().name})

    async def api_version() -> JSONResponse:
        return JSONResponse({"result": KOBOLDAI_API_VERSION})

    async def max_context_length(state: State) -> JSONResponse:
        async with state.use() as slot:
            return value(slot.ready().n_ctx)

    async def max_length() -> JSONResponse:
        return value(DEFAULT_MAX_LENGTH)  # what a request that does not say generates

    for version in ("v1", "latest"):  # KoboldCpp answers both
        router.add_api_route(f"/{version}/model", model_name, methods=["GET"])
        router.add_api_route(f"/{version}/info/version", api_version, methods=["GET"])
        router.add_api_route(
            f"/{version}/config/max_context_length", max_context_length, methods=["GET"]
        )
        router.add_api_route(f"/{version}/config/max_length", max_length, methods=["GET"])

    @router.get("/extra/true_max_context_length")
    async def true_max_context_length(state: State) -> JSONResponse:
        async with state.use() as slot:
            return value(slot.ready().n_ctx)

    @router.get("/extra/version")
    async def koboldcpp_version(state: State) -> JSONResponse:
        return JSONResponse(
            {
                "result": "KoboldCpp",
                "version": KOBOLDCPP_VERSION,
                "protected": state.keys.required,
                "txt2img": False,
                "vision": False,
                "transcribe": False,
            }
        )

    @router.get("/extra/preloadstory")
    async def preloadstory() -> JSONResponse:
        return JSONResponse({})  # no story is preloaded

    async def generate(
        state: AppState, body: KoboldGenerateRequest, http: Request, stream: bool
    ) -> Response:
        if stream and body.n > 1:
            raise APIError(
                400,
                "KoboldCpp's stream carries one text: ask /api/v1/generate for n > 1",
                param="n",
            )
        job = Job(generation_owner(http))
        genkey = body.genkey or secrets.token_hex(16)  # 128 bits: nobody guesses it
        release = functools.partial(genkeys.remove, genkey, job)

        def prepare(slot: ModelSlot, caller: Caller) -> Prepared:
            loaded = slot.ready()
            model = loaded.model
            prompt = kobold_prompt(body, model, loaded.n_ctx)
            _, max_length = kobold_budget(body, loaded.n_ctx)
            params = kobold_params(body, model, loaded.n_ctx, max_length)
            call = KoboldCall(body.n, params.stop, body.trim_stop, bool(body.logprobs), model)
            spec = RequestSpec(prompt.tokens, params, body.n, client=caller.client, prefix="kcpp")
            return Prepared(build_all(loaded, [spec]), Registered(call, release))

        genkeys.add(genkey, job)  # before it is built: an abort may come that early
        try:
            response = await respond(
                state,
                http,
                body,
                1,
                prepare,
                stream=stream,
                submitting=job.submitting,
                failed=release,  # in a stream that waited for its model's load
            )
        except BaseException:  # refused, or failed before its answer began
            release()
            raise
        response.headers[GENKEY_HEADER] = genkey
        return response

    @router.post(
        "/v1/generate",
        openapi_extra=body_spec(KoboldGenerateRequest),
        summary="generate: one result per branch (`n`)",
    )
    async def generate_whole(
        body: Annotated[KoboldGenerateRequest, Depends(parsed(KoboldGenerateRequest))],
        http: Request,
        state: State,
    ) -> Response:
        return await generate(state, body, http, stream=False)

    router.add_api_route(
        "/latest/generate",
        generate_whole,
        methods=["POST"],
        openapi_extra=body_spec(KoboldGenerateRequest),
    )

    @router.post(
        "/extra/generate/stream",
        openapi_extra=body_spec(KoboldGenerateRequest),
        summary="generate, streamed as KoboldCpp's server-sent events",
    )
    async def generate_stream(
        body: Annotated[KoboldGenerateRequest, Depends(parsed(KoboldGenerateRequest))],
        http: Request,
        state: State,
    ) -> Response:
        return await generate(state, body, http, stream=True)

    @router.get("/extra/generate/check")
    @router.post("/extra/generate/check")  # one route each: each its own OpenAPI operation
    async def check(http: Request) -> JSONResponse:
        genkey = await genkey_of(http) if http.method == "POST" else ""
        job = genkeys.find(genkey, generation_owner(http))
        if job is None or job.call is None:
            return JSONResponse({"results": [{"text": ""}]})
        return JSONResponse(job.call.pending())

    @router.post("/extra/abort")
    async def abort(http: Request, state: State) -> JSONResponse:
        job = genkeys.find(await genkey_of(http), generation_owner(http))
        if job is None:
            return JSONResponse({"success": "false", "done": "false"})  # KoboldCpp's strings
        job.aborted = True
        for request_id in job.request_ids:  # its outputs end, as if it had finished
            for slot in state.models.loaded():  # ids are unique: the others ignore it
                slot.ready().runtime.abort(request_id)
        return JSONResponse({"success": "true", "done": "true"})

    @router.post(
        "/extra/tokencount",
        openapi_extra=body_spec(TokenCountRequest),
        summary="the prompt's tokens: `value` (their count) and `ids`",
    )
    async def tokencount(
        body: Annotated[TokenCountRequest, Depends(parsed(TokenCountRequest))],
        state: State,
    ) -> JSONResponse:
        async with state.use() as slot:
            loaded = slot.ready()
            ids = await state.workers.run(
                lambda: tokens_of(loaded, body.prompt, body.special, True)
            )
        return JSONResponse({"value": len(ids), "ids": ids})

    return router
