"""Other servers' token routes, for clients written against them (their model routes are
in routes/models.py):

- TabbyAPI: POST /v1/token/encode and /v1/token/decode (SillyTavern's tokenizer for its
  Tabby type; Mikupad's OpenAI mode probes /v1/token/encode for token counts, with Tabby's
  `text` or Aphrodite's `prompt`).
- text-generation-webui: POST /v1/internal/encode, /decode and /token-count,
  and POST /v1/internal/stop-generation (Mikupad's Cancel in OpenAI mode). There it stops
  the one generation the server runs; here it stops nothing by itself, so that no client
  can stop another's: a generation stops when its own client disconnects, which Mikupad
  does right after (it aborts its stream).

The text routes share /tokenize's work: tokenized on a worker, bounded by the context.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from llama_srb.api.deps import State, parsed
from llama_srb.api.routes.tokenize import check_tokens, tokens_of
from llama_srb.api.schemas.tokens import (
    DecodeRequest,
    DecodeResponse,
    EncodeRequest,
    EncodeResponse,
    TokenCount,
)
from llama_srb.api.state import AppState
from llama_srb.api.workers import body_spec

router = APIRouter(prefix="/v1")


async def encode(state: AppState, body: EncodeRequest) -> EncodeResponse:
    async with state.use() as slot:
        loaded = slot.ready()

        def run() -> EncodeResponse:
            add_bos, special = body.add_bos_token, body.encode_special_tokens
            tokens = tokens_of(loaded, body.content, add_bos, special)
            return EncodeResponse(tokens=tokens, length=len(tokens))

        return await state.workers.run(run)


async def decode(state: AppState, body: DecodeRequest) -> DecodeResponse:
    async with state.use() as slot:
        loaded = slot.ready()

        def run() -> DecodeResponse:
            check_tokens(loaded, body.tokens)
            return DecodeResponse(text=loaded.model.detokenize(body.tokens))

        return await state.workers.run(run)


for prefix in ("/token", "/internal"):

    @router.post(
        f"{prefix}/encode",
        response_model=EncodeResponse,
        openapi_extra=body_spec(EncodeRequest),
    )
    async def encode_route(
        body: Annotated[EncodeRequest, Depends(parsed(EncodeRequest))], state: State
    ) -> Response:
        return _json(await encode(state, body))

    @router.post(
        f"{prefix}/decode",
        response_model=DecodeResponse,
        openapi_extra=body_spec(DecodeRequest),
    )
    async def decode_route(
        body: Annotated[DecodeRequest, Depends(parsed(DecodeRequest))], state: State
    ) -> Response:
        return _json(await decode(state, body))


@router.post(
    "/internal/token-count", response_model=TokenCount, openapi_extra=body_spec(EncodeRequest)
)
async def token_count(
    body: Annotated[EncodeRequest, Depends(parsed(EncodeRequest))], state: State
) -> Response:
    return _json(TokenCount(length=(await encode(state, body)).length))


@router.post("/internal/stop-generation", response_model=str)
async def stop_generation() -> JSONResponse:
    return JSONResponse("OK")  # text-generation-webui's answer


def _json(model: BaseModel) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")
