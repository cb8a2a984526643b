"""The story library's refusals: each a message a person can act on and a `code` (the
routes map each to an HTTP status: api/routes/stories.py)."""

from __future__ import annotations

from typing import Any


class StoryError(Exception):
    """A refusal the client can act on; `code` names it (the routes map it to a status)."""

    code = "story_error"


class StoryNotFound(StoryError):
    code = "story_not_found"


class StoryDeleted(StoryError):
    code = "story_deleted"


class StoryExists(StoryError):
    code = "story_exists"


class LibraryFull(StoryError):
    code = "library_full"


class StoryTooLarge(StoryError):
    code = "story_too_large"


class BadStory(StoryError):
    code = "invalid_story"


class NotAllowed(StoryError):
    code = "not_allowed"


class StoryConflict(StoryError):
    """Others changed what this write changes: nothing was written. `changes`: everything
    since the writer's base revision, to merge and ask about."""

    code = "story_conflict"

    def __init__(self, message: str, conflicts: list[dict[str, Any]], changes: dict[str, Any]):
        super().__init__(message)
        self.conflicts = conflicts
        self.changes = changes
