"""GET /v1/models: the one model this server serves."""

from __future__ import annotations

from fastapi import APIRouter

from llama_srb.api.deps import State
from llama_srb.api.schemas.completions import ModelCard, ModelList

router = APIRouter()


@router.get("/models", response_model=ModelList)
async def models(state: State) -> ModelList:
    return ModelList(data=[ModelCard(id=state.settings.model_name, created=state.created)])
