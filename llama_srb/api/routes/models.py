"""GET /v1/models: the one model this server serves."""

from __future__ import annotations

from fastapi import APIRouter

from llama_srb.api.schemas.completions import ModelCard, ModelList
from llama_srb.api.state import AppState


def models_router(state: AppState) -> APIRouter:
    router = APIRouter()
    card = ModelCard(id=state.settings.model_name, created=state.created)

    @router.get("/models", response_model=ModelList)
    async def models() -> ModelList:
        return ModelList(data=[card])

    return router
