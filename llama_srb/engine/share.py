"""Fair share between clients: the order of the queue, and the room kept for small requests.

Pure bookkeeping for the scheduler, tested without a model. Every request carries its
client (`Request.client`: an API key's name, an address, or a session of an address:
`address:1.2.3.4/session:x`). A client's *unit* is the address of a session, else the
client itself: sessions divide their address's share, they do not multiply it. The rules:

1. **The queue is served by unit, then client, not by arrival.** The next request
   considered is the oldest of the client whose unit holds the fewest live sequences,
   then (within a unit) of the client that holds the fewest (ties: the earlier request).
   Each client's own requests keep their order. A unit that holds `client_sequences`
   already waits until its own requests end.
2. **Large requests leave a reserve free.** A request is *small* when it needs at most
   `reserve_sequences` sequences and `reserve_cells` KV cells. Large requests together
   hold at most `max_sequences` sequences and all cells but `reserve_cells`; the reserve
   sequences come on top. So large work can never take the room a small request needs.
3. **Nothing overtakes a waiting request, except into the reserve.** When the request
   whose turn it is cannot be admitted, later ones wait behind it (it is not starved), but
   small requests of other clients may still go in while small requests together stay
   within the reserve: they cannot delay it, as it may not use the reserve anyway.
   A large request too big to fit beside the reserve runs only on an otherwise idle
   server, and nothing overtakes it while it waits for that.

So a small request waits for the step in progress and for small requests ahead of it in
the reserve, never for large ones: the bound in docs/fairness.md.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from llama_srb.engine.request import Request
from llama_srb.engine.spec import unit_of


def hold(held: Counter[str], client: str, sequences: int) -> None:
    """Count `sequences` for a client and, for a session, for its address too."""
    held[client] += sequences
    unit = unit_of(client)
    if unit != client:
        held[unit] += sequences


def holdings(running: Iterable[Request]) -> Counter[str]:
    """Live sequences per client and per unit."""
    held: Counter[str] = Counter()
    for request in running:
        hold(held, request.client, len(request.live))
    return held


def fair_key(held: Counter[str] | dict[str, int], request: Request) -> tuple[int, int, float]:
    """The order of turns: the unit holding fewest, then the client, then arrival."""
    return held.get(unit_of(request.client), 0), held.get(request.client, 0), request.arrival


@dataclass(frozen=True)
class ShareRules:
    """The settings; zeros turn each rule off (the default: strict order per client)."""

    client_sequences: int = 0  # live sequences one client may hold (0: no cap)
    reserve_sequences: int = 0  # sequence ids for small requests, beyond `max_sequences`
    reserve_cells: int = 0  # KV cells large requests leave to small ones


class FairQueue:
    """The waiting requests: one queue per client, each in arrival order."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[Request]] = {}

    def add(self, request: Request) -> None:
        self._queues.setdefault(request.client, deque()).append(request)

    def remove(self, request: Request) -> None:
        queue = self._queues[request.client]
        queue.remove(request)
        if not queue:
            del self._queues[request.client]

    def __contains__(self, request: object) -> bool:
        return isinstance(request, Request) and request in self._queues.get(request.client, ())

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def __iter__(self) -> Iterator[Request]:
        """Every waiting request, in arrival order."""
        return iter(sorted((r for q in self._queues.values() for r in q), key=_arrival))

    def next(self, held: dict[str, int], passed: set[str]) -> Request | None:
        """The head of the queue of the client whose unit, then itself, holds the fewest
        live sequences (`held`), among clients (and units) not in `passed`; ties go to
        the earlier request."""
        heads = [
            q[0]
            for client, q in self._queues.items()
            if client not in passed and unit_of(client) not in passed
        ]
        return min(heads, key=lambda r: fair_key(held, r), default=None)


def _arrival(request: Request) -> float:
    return request.arrival


@dataclass
class Reserve:
    """What large and small running requests hold, against the room each kind may use:
    sequences as they are live now, cells as reserved at admission."""

    rules: ShareRules
    max_sequences: int  # sequences large requests may hold together
    n_cells: int
    _held: dict[Request, tuple[bool, int]] = field(default_factory=dict)  # small?, cells

    @property
    def enabled(self) -> bool:
        return self.rules.reserve_sequences > 0

    def is_small(self, request: Request, cells: int) -> bool:
        """Whether a request that would reserve `cells` may use the reserve."""
        rules = self.rules
        return (
            self.enabled
            and request.n_branches <= rules.reserve_sequences
            and cells <= rules.reserve_cells
        )

    def fits_large(self, request: Request, cells: int) -> bool:
        """Whether a large request fits beside the large ones running, leaving the reserve."""
        return (
            self.fits_large_sequences(request)
            and self._usage(small=False)[1] + cells <= self.n_cells - self.rules.reserve_cells
        )

    def fits_large_sequences(self, request: Request) -> bool:
        return self._usage(small=False)[0] + request.n_branches <= self.max_sequences

    def fits_beside_reserve(self, request: Request, cells: int) -> bool:
        """Whether it could ever run without the reserve (else: only alone)."""
        return (
            request.n_branches <= self.max_sequences
            and cells <= self.n_cells - self.rules.reserve_cells
        )

    def fits_small(self, request: Request, cells: int) -> bool:
        """Whether a small request fits in the reserve beside the small ones running."""
        sequences, held = self._usage(small=True)
        return (
            sequences + request.n_branches <= self.rules.reserve_sequences
            and held + cells <= self.rules.reserve_cells
        )

    def hold(self, request: Request, small: bool, cells: int) -> None:
        self._held[request] = (small, cells)

    def grow(self, request: Request, cells: int) -> None:
        """A running request took more cells (a refilled branch)."""
        small, held = self._held[request]
        self._held[request] = (small, held + cells)

    def release(self, request: Request) -> None:
        self._held.pop(request, None)

    def _usage(self, small: bool) -> tuple[int, int]:
        """Live sequences and reserved cells of the running requests of one kind."""
        sequences = cells = 0
        for request, (kind, held) in self._held.items():
            if kind is small:
                sequences += len(request.live)
                cells += held
        return sequences, cells
