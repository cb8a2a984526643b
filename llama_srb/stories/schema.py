"""What a story is on the wire: its nodes, memory, author's note and settings, and the
patches that change it; every size bounded here, so bad input is a 400 before the store
sees it.

A node is what the browser UI's tree holds (llama_srb/web/tree.js): a story text and the n
continuations generated from it. The server stores nodes as data and checks only their
shape and sizes; how the UI reads them is its own business.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, StringConstraints

# The bounds, stated once (docs/api.md, "The story library").
MAX_STORIES = 10_000  # in one writer's library (the trash not counted)
MAX_TRASH = 1_000  # in one writer's trash: a delete beyond it purges the oldest
MAX_NODES = 10_000  # live nodes of one story
MAX_DEPTH = 5_000  # a node's ancestors
MAX_TOMBSTONES = 10_000  # deleted nodes a story remembers; beyond, the oldest half goes
MAX_STORY_BYTES = 64 << 20  # JSON of a story's live nodes
MAX_NODE_BYTES = 4 << 20  # JSON of one node
MAX_TEXT_CHARS = 1_000_000  # a node's text, a continuation, the memory
MAX_NOTE_CHARS = 100_000
MAX_NAME_CHARS = 200
MAX_CHOICES = 256  # continuations of one node (the largest n a server allows)
MAX_PIECES = 8_192  # tokens shown word by word in one continuation
MAX_ALTERNATIVES = 20  # per token (logprobs)
MAX_SETTINGS = 64  # keys of the settings form, of a node's params, of its stats
MAX_SETTING_CHARS = 100_000
MAX_NODE_ID = (1 << 31) - 1
TRASH_DAYS = 30  # a deleted story can be restored this long

STORY_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")

NodeId = Annotated[int, Field(ge=1, le=MAX_NODE_ID)]
StoryId = Annotated[str, StringConstraints(pattern=f"^{STORY_ID.pattern}$")]
Token = Annotated[str, StringConstraints(max_length=1_000)]
Setting = (
    Annotated[str, StringConstraints(max_length=MAX_SETTING_CHARS)] | bool | int | float | None
)
# Names are data, never file names; only control characters (which no one types and
# which break a listing) are refused.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _check_name(value: str) -> str:
    name = value.strip()
    if not name:
        raise ValueError("a story's name cannot be empty")
    if _CONTROL.search(name):
        raise ValueError("a story's name cannot hold control characters (newlines, tabs…)")
    return name


StoryName = Annotated[
    str, StringConstraints(max_length=MAX_NAME_CHARS), AfterValidator(_check_name)
]
MAX_MODEL_CHARS = 256  # a model's name (as /v1/models lists it)


def _check_model(value: str | None) -> str | None:
    """A model's name, or None (\"\" too): the server's current model."""
    if value and _CONTROL.search(value):
        raise ValueError("a model's name cannot hold control characters")
    return (value or "").strip() or None


# The model a story is written with (GET /v1/models' ids), kept as data: a name the server
# no longer serves stays, and the UI falls back to the server's current model for it.
ModelName = Annotated[
    Annotated[str, StringConstraints(max_length=MAX_MODEL_CHARS)] | None,
    AfterValidator(_check_model),
]

NODE_FIELDS = (
    "parent",
    "via",
    "via_node",
    "text",
    "model_chars",
    "retry_of",
    "bookmarked",
    "choices",
    "params",
    "context",
    "stats",
    "created",
)
CONTEXT_FIELDS = ("memory", "note", "depth")


def _absent(value: object) -> bool:
    return value is None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Piece(Strict):
    """One token of a continuation shown word by word: its text, logprob, alternatives."""

    t: Token
    lp: float | None = None
    top: list[tuple[Token, float | None]] = Field(default_factory=list, max_length=MAX_ALTERNATIVES)


class Choice(Strict):
    text: str = Field("", max_length=MAX_TEXT_CHARS)
    finish_reason: str | None = Field(None, max_length=32)
    tokens: int = Field(0, ge=0, le=1 << 31)
    edited: bool = False
    # Absent rather than null, as the UI keeps them: what was not sent is not stored.
    original: str | None = Field(None, max_length=MAX_TEXT_CHARS, exclude_if=_absent)
    pieces: list[Piece] | None = Field(None, max_length=MAX_PIECES, exclude_if=_absent)


class Context(Strict):
    """Memory and author's note (the note `depth` lines from the end)."""

    memory: str = Field("", max_length=MAX_TEXT_CHARS)
    note: str = Field("", max_length=MAX_NOTE_CHARS)
    depth: int = Field(3, ge=1, le=10_000)


class ContextPatch(Strict):
    memory: str | None = Field(None, max_length=MAX_TEXT_CHARS)
    note: str | None = Field(None, max_length=MAX_NOTE_CHARS)
    depth: int | None = Field(None, ge=1, le=10_000)


class Node(Strict):
    """A node; in a patch, only the fields sent change (`model_fields_set`)."""

    id: NodeId
    parent: NodeId | None = None
    via: int | None = Field(None, ge=0, lt=MAX_CHOICES)
    via_node: NodeId | None = None  # the node whose card `via` is, when not the parent
    text: str = Field("", max_length=MAX_TEXT_CHARS)
    model_chars: int = Field(0, ge=0, le=1 << 53)
    retry_of: NodeId | None = None
    bookmarked: bool = False
    choices: list[Choice] = Field(default_factory=list, max_length=MAX_CHOICES)
    params: dict[str, JsonValue] | None = Field(None, max_length=MAX_SETTINGS)
    context: Context | None = None
    stats: dict[str, float | None] | None = Field(None, max_length=MAX_SETTINGS)
    created: str | None = Field(None, max_length=64)

    def sent(self) -> dict[str, Any]:
        """The fields the client sent (all of them for a new node), as JSON values."""
        return self.model_dump(mode="json", include=set(self.model_fields_set) - {"id"})

    def body(self) -> dict[str, Any]:
        """Every field, defaults filled in: a node as stored."""
        return self.model_dump(mode="json", exclude={"id"})


class StoryDraft(Strict):
    """A new story: empty, or whole (an import, an upgrade from the browser's copy)."""

    id: StoryId | None = None  # chosen by the client, so a story made offline keeps its id
    name: StoryName | None = None
    current: NodeId | None = None
    model: ModelName = None
    context: Context = Field(default_factory=Context)
    settings: dict[str, Setting] = Field(default_factory=dict, max_length=MAX_SETTINGS)
    nodes: list[Node] = Field(default_factory=list, max_length=MAX_NODES)


class StoryPatch(Strict):
    """A conditional write: what changed since `base_revision`, the revision the writer
    last saw. Nodes it sends are created or changed (only the fields sent), `deleted`
    ones removed; `name`, `current` and `model` are last-writer-wins, the rest is merged.
    `model` sent as null or "" forgets the story's model (the server's current one then)."""

    base_revision: int = Field(ge=1)
    name: StoryName | None = None
    current: NodeId | None = None
    model: ModelName = None
    context: ContextPatch | None = None
    settings: dict[str, Setting] | None = Field(None, max_length=MAX_SETTINGS)
    nodes: list[Node] = Field(default_factory=list, max_length=MAX_NODES)
    deleted: list[NodeId] = Field(default_factory=list, max_length=MAX_NODES)


class Duplicate(Strict):
    name: StoryName | None = None
