"""What one prompt's request asks the engine for: fixed when the API builds it, read by the
engine and the API alike (engine/build.py builds a request from it)."""

from __future__ import annotations

from dataclasses import dataclass

from llama_srb.sampling.params import SamplingParams

SESSION_OF = "/"  # a client `address:…/session:…` is a session nested under its address


def unit_of(client: str) -> str:
    """Whose share a client's requests count against: a session's address, else itself."""
    return client.partition(SESSION_OF)[0]


def branch_count(n_choices: int, best_of: int | None, deterministic: bool = False) -> int:
    """Branches a request decodes: n, or best_of when it asks for more. One when it is
    deterministic (greedy): its choices are the same text, which n decoded rows would
    not always be (their logits round differently by their place in the batch)."""
    return 1 if deterministic else max(n_choices, best_of or 0)


@dataclass(frozen=True)
class RequestSpec:
    """One prompt's request: `n_choices` returned, from `best_of` branches when more."""

    prompt: list[int]
    params: SamplingParams
    n_choices: int = 1
    best_of: int | None = None
    prompt_logprobs: bool = False  # echo + logprobs: score every prompt token
    client: str = ""  # who asks (engine/share.py; a session's unit is its address)
    prefix: str = "cmpl"  # of its public id

    @property
    def n_branches(self) -> int:
        return branch_count(self.n_choices, self.best_of, self.params.deterministic)

    @property
    def cells_needed(self) -> int:
        """Worst-case KV cells: the prompt once (shared by all branches) + every branch."""
        return len(self.prompt) + self.n_branches * self.params.max_tokens
