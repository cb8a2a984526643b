"""The sampling stage (engine/sampling_stage.py) on the real server, both models: /metrics
counts the logits the host read, a whole row (n_vocab float32) for every row sampled:
the prompt's last row once for all n branches, then one row per branch and token."""

from __future__ import annotations

import uuid

from tests.helpers import complete
from tests.integration.bundled import ModelFacts
from tests.support.server import RunningServer

STORY = "The old lighthouse keeper climbed the stairs one last time. At the top, he"


def test_metrics_count_a_whole_row_per_row_the_host_read(
    server: RunningServer, model_facts: ModelFacts
) -> None:
    n, max_tokens = 4, 6
    before = server.metric("llama_srb_logits_bytes_read_total")
    out = complete(
        server,
        prompt=f"{uuid.uuid4().hex} {STORY}",
        n=n,
        max_tokens=max_tokens,
        ignore_eos=True,
        seed=3,
    )
    assert [c["finish_reason"] for c in out["choices"]] == ["length"] * n
    read = server.metric("llama_srb_logits_bytes_read_total") - before
    rows = 1 + n * (max_tokens - 1)
    assert read == rows * model_facts.n_vocab * 4
