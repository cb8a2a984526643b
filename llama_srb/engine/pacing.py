"""The step budget: how many prompt tokens a step may carry while streams are decoding.

Every running stream waits for the whole step, so a step that carries a 512-token prompt
chunk freezes them all for its duration. While branches decode, the prefill share of a
step is sized to keep the step near `budget` seconds; with nothing decoding, prefill runs
at full batch. The cost model is measured online, never assumed: the time of a step
that only decodes (an EWMA), and the extra seconds each prompt token adds (an EWMA over
steps that prefill). Both drift as prompts get longer (attention) and streams come and
go; the averages follow.
"""

from __future__ import annotations

from dataclasses import dataclass

ALPHA = 0.3  # weight of the newest measurement: follows a growing context in a few steps
PROBE_CHUNK = 32  # the first chunk beside streams, before any prefill was measured
MIN_CHUNK = 16  # every step moves a waiting prompt on, however tight the budget
# Prompts always get at least this share of a step's decode time, or of the budget when
# that is longer. Once decoding alone outlasts the budget (many streams), the stall bound
# is lost anyway: a prompt's share then grows with the step instead of staying at a
# budget's quarter, so newly admitted requests reach their first token in a step or two.
MIN_PREFILL_SHARE = 0.25


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else old + ALPHA * (new - old)


@dataclass
class StepPacer:
    """Owned by the engine thread: the scheduler asks, the engine's decode timings teach."""

    budget: float = 0.0  # seconds per step while streams decode; 0: no limit (full batch)
    decode_seconds: float | None = None  # a step of decode tokens only
    token_seconds: float | None = None  # what one prompt token adds to a step

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def prefill_room(self, n_decode: int, room: int) -> int:
        """Prompt tokens the next step may carry beside `n_decode` decode tokens, out of
        the `room` left in the batch."""
        if not self.enabled or n_decode == 0 or room <= 0:
            return room
        if self.token_seconds is None:
            return min(room, PROBE_CHUNK)
        decode = self.decode_seconds or 0.0
        spare = max(self.budget - decode, MIN_PREFILL_SHARE * max(self.budget, decode))
        return min(room, max(MIN_CHUNK, int(spare / self.token_seconds)))

    def observe(self, n_decode: int, n_prefill: int, seconds: float) -> None:
        """One llama_decode call: `n_decode` generated tokens, `n_prefill` prompt tokens."""
        if n_prefill == 0:
            self.decode_seconds = _ewma(self.decode_seconds, seconds)
            return
        if n_prefill < MIN_CHUNK:  # a prompt's last token, or a tail: mostly fixed cost
            return
        base = (self.decode_seconds or 0.0) if n_decode else 0.0
        # Floor: a noisy decode estimate must not make prompt tokens look free.
        per_token = max(seconds - base, seconds / 4) / n_prefill
        self.token_seconds = _ewma(self.token_seconds, per_token)
