"""Prompt progress while a long prompt is read, as llama.cpp's server streams it with
`return_progress` (tools/server/server-task.cpp, result_prompt_progress): `prompt_progress`
{total, cache, processed, time_ms}. The overall progress is processed/total, the part
computed here (processed - cache)/(total - cache).

One prompt's n branches share one read, so a call reports each of its prompts once: after
every chunk of it the engine read (RequestOutput.prompt_processed), and once whole, just
before its first tokens. `time_ms` counts from the call's arrival (queueing included;
llama.cpp's starts when its slot begins the prompt).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from llama_srb.engine.outputs import RequestOutput


@dataclass
class PromptProgress:
    started: float = field(default_factory=time.perf_counter)
    whole: set[int] = field(default_factory=set)  # prompt positions read to the end

    def of(self, position: int, out: RequestOutput) -> dict[str, Any] | None:
        """The progress that `out` reports for its prompt, if any."""
        if out.prompt_processed is not None:
            processed = out.prompt_processed
        elif position not in self.whole and out.times.first_token is not None:  # read
            self.whole.add(position)
            processed = out.prompt_tokens
        else:
            return None
        return {
            "total": out.prompt_tokens,
            "cache": out.cached_tokens,
            "processed": processed,
            "time_ms": round((time.perf_counter() - self.started) * 1000),
        }
