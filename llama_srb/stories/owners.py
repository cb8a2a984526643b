"""Whose stories: every story belongs to one writer (an API key's name; without keys, the
local writer), who alone sees it; an admin sees and manages every writer's. And how fast
one writer may make new stories (a token bucket), so no client can flood the library.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints

from llama_srb.config import KEY_NAME

LOCAL = ""  # the owner of stories made without keys (and of every story made before owners)


@dataclass(frozen=True)
class Access:
    """Who asks: the stories it makes are `owner`'s; `admin` sees and changes every story."""

    owner: str
    admin: bool = False

    def sees(self, owner: str) -> bool:
        return self.admin or owner == self.owner


@dataclass
class CreationRate:
    """At most `per_minute` new stories per owner per minute, in bursts of as many: a
    bucket per owner (owners are key names: a bounded set) that refills at per_minute / 60
    a second. Thread-safe (the store's jobs run on worker threads)."""

    per_minute: int
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)  # tokens, when
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, owner: str, now: float | None = None) -> float:
        """Take one; 0 if it was there, else the seconds until one will be (nothing taken)."""
        now = time.monotonic() if now is None else now
        rate = self.per_minute / 60
        with self._lock:
            tokens, then = self._buckets.get(owner, (float(self.per_minute), now))
            tokens = min(float(self.per_minute), tokens + (now - then) * rate)
            if tokens < 1:
                self._buckets[owner] = (tokens, now)
                return (1 - tokens) / rate
            self._buckets[owner] = (tokens - 1, now)
            return 0.0

    @staticmethod
    def retry_after(wait: float) -> str:
        return str(max(1, math.ceil(wait)))


class Handover(BaseModel):
    """An admin gives a story to another writer: a key's name, or null (the local writer)."""

    model_config = ConfigDict(extra="forbid")

    owner: Annotated[str, StringConstraints(pattern=f"^{KEY_NAME.pattern}$")] | None
