"""/v1/stories: the story library (llama_srb/stories), for the browser UI and any client.

GET lists the stories; POST makes one (empty, or whole: an import); GET /{id} reads one
(`?since=R`: only what changed after revision R); PATCH /{id} is a conditional write on
the revision the writer last saw, merged with what others wrote since, or a 409 naming
what clashes; DELETE /{id} moves it to the trash, POST /{id}/restore brings it back,
POST /{id}/duplicate copies it; DELETE /trash empties the trash; POST /{id}/owner (an
admin's) gives a story to another writer. The API key gates these as every /v1 route,
and a key's name owns what it makes: another writer's story is a 404 (api/clients.py).
Only the server's own pages may call these from a browser (api/origins.py).
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
from llama_srb.stories.errors import (
    BadStory,
    LibraryFull,
    NotAllowed,
    StoryConflict,
    StoryDeleted,
    StoryError,
    StoryExists,
    StoryNotFound,
    StoryTooLarge,
)
from llama_srb.stories.owners import Access, CreationRate, Handover
from llama_srb.stories.schema import STORY_ID, Duplicate, StoryDraft, StoryPatch
from llama_srb.stories.store import StoryStore

T = TypeVar("T")

_STATUS: dict[type[StoryError], int] = {
    StoryNotFound: 404,
    StoryDeleted: 410,
    StoryExists: 409,
    LibraryFull: 409,
    StoryTooLarge: 413,
    BadStory: 400,
    NotAllowed: 403,
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


def room_for_one(state: AppState, who: Access) -> None:
    """A 429 with Retry-After when `who` made its share of new stories this minute."""
    wait = state.story_rate.take(who.owner)
    if wait:
        raise APIError(
            429,
            f"you made {state.settings.story_creations} stories in the last minute, the"
            f" server's limit (--story-creations): try again in {wait:.0f} s",
            code="too_many_stories",
            headers={"Retry-After": CreationRate.retry_after(wait)},
        )


@router.get("", summary="the stories in your library, the last opened first")
async def list_stories(http: Request, state: State) -> JSONResponse:
    who = state.library_access(http)
    return JSONResponse({"object": "list", "data": await call(state, lambda s: s.list(who))})


@router.post("", status_code=201, openapi_extra=body_spec(StoryDraft), summary="a new story")
async def create(
    draft: Annotated[StoryDraft, Depends(parsed(StoryDraft))], http: Request, state: State
) -> JSONResponse:
    who = state.library_access(http)
    room_for_one(state, who)
    return tagged(await call(state, lambda s: s.create(draft, who)), 201)


@router.delete("/trash", summary="empty the trash: its stories are gone for good")
async def empty_trash(http: Request, state: State) -> JSONResponse:
    who = state.library_access(http)
    purged = await call(state, lambda s: s.empty_trash(who))
    return JSONResponse({"object": "story.trash", "purged": purged})


@router.get("/{sid}", summary="a story, whole; with `since`, what changed after that revision")
async def read(
    sid: str, http: Request, state: State, since: Annotated[int | None, Query(ge=0)] = None
) -> JSONResponse:
    story, who = story_id(sid), state.library_access(http)
    if since is not None:
        return tagged(await call(state, lambda s: s.changes(story, since, who)))
    return tagged(await call(state, lambda s: s.get(story, who)))


@router.patch(
    "/{sid}",
    openapi_extra=body_spec(StoryPatch),
    summary="a conditional write on `base_revision`, merged with others' since",
)
async def write(
    sid: str,
    patch: Annotated[StoryPatch, Depends(parsed(StoryPatch))],
    http: Request,
    state: State,
) -> JSONResponse:
    story, who = story_id(sid), state.library_access(http)
    try:
        result = await call(state, lambda s: s.patch(story, patch, who))
    except StoryConflict as exc:
        body = error_body(409, str(exc), code=exc.code)
        body.update(conflicts=exc.conflicts, changes=exc.changes)
        return JSONResponse(body, 409)
    return tagged({**result, "object": "story.write"})


@router.delete("/{sid}", summary="to the trash (restore brings it back)")
async def delete(sid: str, http: Request, state: State) -> JSONResponse:
    story, who = story_id(sid), state.library_access(http)
    await call(state, lambda s: s.delete(story, who))
    return JSONResponse({"id": story, "object": "story", "deleted": True})


@router.post("/{sid}/restore", summary="back from the trash")
async def restore(sid: str, http: Request, state: State) -> JSONResponse:
    story, who = story_id(sid), state.library_access(http)
    return tagged(await call(state, lambda s: s.restore(story, who)))


@router.post("/{sid}/duplicate", status_code=201, summary="a copy, as a new story")
async def duplicate(sid: str, http: Request, state: State) -> JSONResponse:
    story, who = story_id(sid), state.library_access(http)
    name = None
    if await http.body():
        name = (await parsed(Duplicate)(http, state)).name
    room_for_one(state, who)
    return tagged(await call(state, lambda s: s.duplicate(story, name, who)), 201)


@router.post(
    "/{sid}/owner",
    openapi_extra=body_spec(Handover),
    summary="give a story to another writer (an admin key's)",
)
async def give(
    sid: str, body: Annotated[Handover, Depends(parsed(Handover))], http: Request, state: State
) -> JSONResponse:
    story, who = story_id(sid), state.library_access(http)
    owner = body.owner or ""
    return tagged(await call(state, lambda s: s.give(story, owner, who)))
