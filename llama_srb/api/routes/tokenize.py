"""POST /tokenize and /detokenize, as llama.cpp's server has them (and /tokenize with vLLM's
body too): writing tools use them to count tokens against the context before they send a
prompt."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from pydantic import BaseModel

from llama_srb.api.deps import State, parsed
from llama_srb.api.errors import APIError
from llama_srb.api.input.prompts import tokenize_text
from llama_srb.api.schemas.tokens import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    TokenPiece,
)
from llama_srb.api.workers import body_spec
from llama_srb.served import Served

router = APIRouter()


@router.post("/tokenize", response_model=TokenizeResponse, openapi_extra=body_spec(TokenizeRequest))
async def tokenize(
    body: Annotated[TokenizeRequest, Depends(parsed(TokenizeRequest))], state: State
) -> Response:
    async with state.use(state.models.named(body.model)) as slot:
        return await state.workers.run(lambda: _tokenized(slot.ready(), body))


def _tokenized(loaded: Served, body: TokenizeRequest) -> Response:
    """A worker's job: megabytes of text take seconds, JSON included."""
    tokens = tokens_of(loaded, body.text, body.bos, body.parse_special)
    count, most = len(tokens), loaded.n_ctx
    if not body.with_pieces:
        return _json(TokenizeResponse(tokens=tokens, count=count, max_model_len=most))
    pieces = [TokenPiece(id=t, piece=_piece(loaded.model.special_piece(t))) for t in tokens]
    return _json(TokenizeResponse(tokens=pieces, count=count, max_model_len=most))


@router.post(
    "/detokenize", response_model=DetokenizeResponse, openapi_extra=body_spec(DetokenizeRequest)
)
async def detokenize(
    body: Annotated[DetokenizeRequest, Depends(parsed(DetokenizeRequest))], state: State
) -> Response:
    async with state.use() as slot:
        loaded = slot.ready()

        def run() -> Response:
            check_tokens(loaded, body.tokens)
            return _json(DetokenizeResponse(content=loaded.model.detokenize(body.tokens)))

        return await state.workers.run(run)


def tokens_of(loaded: Served, text: str, add_special: bool, parse_special: bool) -> list[int]:
    """A worker's job: megabytes of text take seconds."""
    if parse_special:  # llama.cpp's special-token pass is the costly one: bounded first
        return tokenize_text(loaded.model, text, loaded.n_ctx, "content", add_special)
    return loaded.model.tokenize(text, add_special, parse_special=False)


def check_tokens(loaded: Served, tokens: list[int]) -> None:
    """A 400 for an id outside the vocabulary: llama.cpp would abort the process on it."""
    error = loaded.model.vocab_error(tokens)
    if error is not None:
        raise APIError(400, error, "tokens")


def _json(model: BaseModel) -> Response:
    """The response, serialized here (on a worker): it may be megabytes of token ids."""
    return Response(model.model_dump_json(), media_type="application/json")


def _piece(raw: bytes) -> str | list[int]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)
