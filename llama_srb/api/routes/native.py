"""llama.cpp's own API, at the root as its server has it: POST /completion (and
/completions) and GET /props. SillyTavern's "llama.cpp" API type and Mikupad's default mode
speak only this. Same engine path as /v1/completions: each prompt evaluated once, its n
results decoded together."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from llama_srb.api.clients import Caller
from llama_srb.api.deps import State, parsed
from llama_srb.api.input.native import native_params, sampler_list
from llama_srb.api.input.params import build_all
from llama_srb.api.input.prompts import count_prompts, parse_prompts
from llama_srb.api.models import ModelSlot
from llama_srb.api.render.native import NativeCall, NativeOptions, generation_settings
from llama_srb.api.render.progress import PromptProgress
from llama_srb.api.routes.generate import Prepared, respond
from llama_srb.api.schemas.native import NativeCompletionRequest
from llama_srb.api.workers import body_spec
from llama_srb.config import Settings
from llama_srb.engine.spec import RequestSpec
from llama_srb.sampling.params import SamplingParams

router = APIRouter()


async def completion(
    body: Annotated[NativeCompletionRequest, Depends(parsed(NativeCompletionRequest))],
    http: Request,
    state: State,
) -> Response:
    def prepare(slot: ModelSlot, caller: Caller) -> Prepared:
        loaded = slot.ready()
        model = loaded.model
        prompts = parse_prompts(body.prompt, model, loaded.n_ctx)
        longest = max(len(p.tokens) for p in prompts)
        params = native_params(body, model, loaded.n_ctx, longest)
        specs = [
            RequestSpec(p.tokens, params, body.n, body.best_of, client=caller.client)
            for p in prompts
        ]
        options = NativeOptions(
            model=slot.name,
            n=body.n,
            n_probs=body.n_probs,
            post_sampling_probs=body.post_sampling_probs,
            return_tokens=body.return_tokens,
            stream=body.stream,
            samplers=tuple(sampler_list(body)),
        )
        call = NativeCall(options, params, prompts, model)
        if body.return_progress:
            call.progress = PromptProgress()
        return Prepared(build_all(loaded, specs), call)

    return await respond(state, http, body, count_prompts(body.prompt), prepare)


for path in ("/completion", "/completions"):
    router.add_api_route(
        path,
        completion,
        methods=["POST"],
        openapi_extra=body_spec(NativeCompletionRequest),
        summary="llama.cpp's completion API",
    )


@router.get("/props")
async def props(state: State) -> JSONResponse:
    """llama-server's /props: what SillyTavern reads to derive its templates."""
    settings = state.settings
    async with state.use() as slot:
        return JSONResponse(_props(settings, slot))


def _props(settings: Settings, slot: ModelSlot) -> dict[str, object]:
    loaded, served = slot.ready(), slot.chat_template()
    model = loaded.model
    # llama-server's defaults say -1 for "until the end"; ours is what fits (native_params)
    defaults = {
        **generation_settings(SamplingParams(), NativeOptions(slot.name, 1)),
        "n_predict": -1,
        "max_tokens": -1,
    }
    return {
        "default_generation_settings": {
            "id": 0,
            "id_task": -1,
            "n_ctx": loaded.n_ctx,
            "speculative": False,
            "is_processing": False,
            "params": defaults,
            "prompt": "",
        },
        "total_slots": settings.max_sequences,
        "model_alias": slot.name,
        "model_path": str(slot.settings.resolved_model_path()),
        "chat_template": served.source,
        "chat_template_source": served.origin,  # ours: where it came from
        "bos_token": model.special_text(model.bos),
        "eos_token": model.special_text(model.eos),
        "modalities": {"vision": False, "audio": False},
        "build_info": "llama-srb",
    }
