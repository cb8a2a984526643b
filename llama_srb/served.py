"""The running engine as the API sees it: one narrow, typed face, built by the loader.

The API holds a `Served` and nothing else of what the loader made: the model (read
through `Tokenizer`), the context's size, the engine thread's doorway (`Doorway`: submit,
abort, live branching, drain), the snapshot the engine publishes after its steps, and the
watchdog over its step in progress. The engine and the llama.cpp context stay the
loader's (loader.py), so no route, worker or test reaches into the engine's state; the
unit tests build this face over a fake model and engine (tests/unit/conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from llama_srb.engine.build import Built, Submission
from llama_srb.engine.generation import Generation, Interrupted
from llama_srb.engine.stats import EngineSnapshot
from llama_srb.engine.watch import Watchdog
from llama_srb.native import Model
from llama_srb.sampling.branch import BranchSampler


class Tokenizer(Protocol):
    """What the API reads of the model: its vocabulary, special tokens and text
    (native.Model; the unit tests' FakeModel)."""

    @property
    def n_vocab(self) -> int: ...

    @property
    def bos(self) -> int: ...

    @property
    def eos(self) -> int: ...

    @property
    def add_bos(self) -> bool: ...

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]: ...

    def spells_special(self, text: str) -> bool: ...

    def piece(self, token: int) -> bytes: ...

    def text(self, tokens: Sequence[int]) -> str: ...

    def special_piece(self, token: int) -> bytes: ...

    def special_text(self, token: int) -> str: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def vocab_error(self, tokens: Sequence[int]) -> str | None: ...


class Doorway(Protocol):
    """The engine thread's doorway, as the API uses it (engine/runtime.py Runtime): the
    queue it bounds, requests handed over and aborted, a running request's branches
    dropped or steered, and the shutdown, whose state it alone keeps."""

    @property
    def waiting(self) -> int: ...

    def waiting_of(self, client: str) -> int: ...

    @property
    def closing(self) -> bool:
        """Draining for shutdown: new requests are refused."""
        ...

    @property
    def died(self) -> str | None:
        """Why the engine thread ended unasked, once it has: the server must exit."""
        ...

    def generate(self, submission: Submission, timeout: float | None = None) -> Generation: ...

    def abort(self, request_id: str) -> None: ...

    # `refill` is a branch built by engine/build.py's build_refill: the API only hands it on.
    async def drop(self, request_id: str, index: int, refill: Built[Any] | None) -> int | None: ...

    async def steer(
        self, request_id: str, index: int, sampler: Built[BranchSampler] | None, append: list[int]
    ) -> None: ...

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet ended."""
        ...

    async def drain(
        self, grace: float, ending: Callable[[float], Interrupted] | None = None
    ) -> None: ...

    def hurry(self) -> None: ...

    def fail_flights(self, reason: str) -> None: ...


@dataclass(frozen=True, eq=False)
class Served:
    """A loaded model and its engine, for the API.

    `model` is the native model: the engine's builders (engine/build.py) and the constraint
    compiler make sampler chains and token tables from its vocabulary; everything else in
    the API reads it as a `Tokenizer`.
    """

    model: Model
    n_ctx: int
    runtime: Doorway
    snapshot: Callable[[], EngineSnapshot]  # the counters the engine last published
    watchdog: Watchdog  # is the engine stuck in a step? (event loop only)
    # Stop the engine thread and free the native objects; False if the thread is stuck in
    # a step (then they are left to the process's exit, as it still uses them).
    close: Callable[[], bool]
