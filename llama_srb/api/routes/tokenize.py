"""POST /tokenize and /detokenize, as llama.cpp's server has them: writing tools use them to
count tokens against the context before they send a prompt."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from pydantic import BaseModel, Field

from llama_srb.api.body import body_spec, parsed
from llama_srb.api.errors import APIError
from llama_srb.api.prompts import tokenize_text
from llama_srb.api.state import AppState


class TokenizeRequest(BaseModel):
    content: str
    add_special: bool = Field(False, description="add the BOS token the model wants, if any")
    parse_special: bool = Field(True, description="read `<start_of_turn>` etc. as one token")
    with_pieces: bool = Field(False, description="return each token's text beside its id")


class TokenPiece(BaseModel):
    id: int
    piece: str | list[int]  # the text, or the bytes when they are not valid UTF-8 alone


class TokenizeResponse(BaseModel):
    tokens: list[int] | list[TokenPiece]


class DetokenizeRequest(BaseModel):
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    content: str


def tokenize_router(state: AppState) -> APIRouter:
    router = APIRouter()

    @router.post(
        "/tokenize", response_model=TokenizeResponse, openapi_extra=body_spec(TokenizeRequest)
    )
    async def tokenize(
        body: Annotated[TokenizeRequest, Depends(parsed(TokenizeRequest))],
    ) -> Response:
        loaded = state.ready()
        model = loaded.model

        def run() -> Response:  # megabytes of text take seconds: off the loop, JSON included
            if body.parse_special:  # llama.cpp's special-token pass is the costly one
                tokens = tokenize_text(
                    model, body.content, loaded.n_ctx, "content", body.add_special
                )
            else:
                tokens = model.tokenize(body.content, body.add_special, parse_special=False)
            if not body.with_pieces:
                return _json(TokenizeResponse(tokens=tokens))
            pieces = [TokenPiece(id=t, piece=_piece(model.special_piece(t))) for t in tokens]
            return _json(TokenizeResponse(tokens=pieces))

        return await state.workers.run(run)

    @router.post(
        "/detokenize",
        response_model=DetokenizeResponse,
        openapi_extra=body_spec(DetokenizeRequest),
    )
    async def detokenize(
        body: Annotated[DetokenizeRequest, Depends(parsed(DetokenizeRequest))],
    ) -> Response:
        model = state.ready().model

        def run() -> Response:
            bad = next((t for t in body.tokens if not 0 <= t < model.n_vocab), None)
            if bad is not None:  # llama.cpp would abort the process on it
                raise APIError(
                    400, f"token id {bad} is not in the vocabulary [0, {model.n_vocab})", "tokens"
                )
            return _json(DetokenizeResponse(content=model.detokenize(body.tokens)))

        return await state.workers.run(run)

    return router


def _json(model: BaseModel) -> Response:
    """The response, serialized here (on a worker): it may be megabytes of token ids."""
    return Response(model.model_dump_json(), media_type="application/json")


def _piece(raw: bytes) -> str | list[int]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)
