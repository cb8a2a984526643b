"""/v1/stories: the story library (llama_srb/stories), for the browser UI and any client.

GET lists the stories; POST makes one (empty, or whole: an import); GET /{id} reads one
(`?since=R`: only what changed after revision R); PATCH /{id} is a conditional write on
the revision the writer last saw, merged with what others wrote since, or a 409 naming
what clashes; DELETE /{id} moves it to the trash, POST /{id}/restore brings it back,
POST /{id}/duplicate copies it. The API key gates these as every /v1 route.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from llama_srb.api.deps import State, parsed
from llama_srb.api.errors import APIError, error_body
from llama_srb.api.state import AppState
from llama_srb.api.workers import body_spec
from llama_srb.stories.schema import STORY_ID, Duplicate, StoryDraft, StoryPatch
from llama_srb.stories.store import (
    BadStory,
    LibraryFull,
    StoryConflict,
    StoryDeleted,
    StoryError,
    StoryExists,
    StoryNotFound,
    StoryStore,
    StoryTooLarge,
)

T = TypeVar("T")

_STATUS: dict[type[StoryError], int] = {
    StoryNotFound: 404,
    StoryDeleted: 410,
    StoryExists: 409,
    LibraryFull: 409,
    StoryTooLarge: 413,
    BadStory: 400,
}

router = APIRouter(prefix="/stories")


async def call(state: AppState, job: Callable[[StoryStore], T]) -> T:
    """`job` on a thread (SQLite blocks), its refusals as API errors."""
    store = state.story_store()
    try:
        return await asyncio.to_thread(job, store)
    except StoryConflict:
        raise
    except StoryError as exc:
        raise APIError(_STATUS[type(exc)], str(exc), code=exc.code) from None


def story_id(value: str) -> str:
    if not STORY_ID.fullmatch(value):
        raise APIError(400, f"{value[:80]!r} is not a story id (8 to 64 of A-Z a-z 0-9 _ -)", "id")
    return value


def tagged(body: dict[str, Any], status: int = 200) -> JSONResponse:
    return JSONResponse(body, status, headers={"ETag": f'"{body["revision"]}"'})


@router.get("", summary="the stories in the library, the last opened first")
async def list_stories(state: State) -> JSONResponse:
    return JSONResponse({"object": "list", "data": await call(state, lambda s: s.list())})


@router.post("", status_code=201, openapi_extra=body_spec(StoryDraft), summary="a new story")
async def create(
    draft: Annotated[StoryDraft, Depends(parsed(StoryDraft))], state: State
) -> JSONResponse:
    return tagged(await call(state, lambda s: s.create(draft)), 201)


@router.get("/{sid}", summary="a story, whole; with `since`, what changed after that revision")
async def read(
    sid: str, state: State, since: Annotated[int | None, Query(ge=0)] = None
) -> JSONResponse:
    story = story_id(sid)
    if since is not None:
        return tagged(await call(state, lambda s: s.changes(story, since)))
    return tagged(await call(state, lambda s: s.get(story)))


@router.patch(
    "/{sid}",
    openapi_extra=body_spec(StoryPatch),
    summary="a conditional write on `base_revision`, merged with others' since",
)
async def write(
    sid: str, patch: Annotated[StoryPatch, Depends(parsed(StoryPatch))], state: State
) -> JSONResponse:
    story = story_id(sid)
    try:
        result = await call(state, lambda s: s.patch(story, patch))
    except StoryConflict as exc:
        body = error_body(409, str(exc), code=exc.code)
        body.update(conflicts=exc.conflicts, changes=exc.changes)
        return JSONResponse(body, 409)
    return tagged({**result, "object": "story.write"})


@router.delete("/{sid}", summary="to the trash (restore brings it back)")
async def delete(sid: str, state: State) -> JSONResponse:
    story = story_id(sid)
    await call(state, lambda s: s.delete(story))
    return JSONResponse({"id": story, "object": "story", "deleted": True})


@router.post("/{sid}/restore", summary="back from the trash")
async def restore(sid: str, state: State) -> JSONResponse:
    story = story_id(sid)
    return tagged(await call(state, lambda s: s.restore(story)))


@router.post("/{sid}/duplicate", status_code=201, summary="a copy, as a new story")
async def duplicate(sid: str, http: Request, state: State) -> JSONResponse:
    story = story_id(sid)
    name = None
    if await http.body():
        name = (await parsed(Duplicate)(http, state)).name
    return tagged(await call(state, lambda s: s.duplicate(story, name)), 201)
