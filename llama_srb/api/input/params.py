"""A request's fields → the engine's SamplingParams, and with its prompts' tokens the
engine requests themselves (sampler chains built: a worker thread's job). The params are
the sampler settings, the default length (what fits), and what constrains the output: a
grammar (GBNF, Lark, a regular expression, a JSON schema) and logit bias. Each route's own
fields (chat's, llama.cpp's) are read in input/chat.py and input/native.py, which end here.

Checked while the request is prepared, so that a bad schema or bias is a 400 that says
what is wrong before anything is queued. Every constraint is compiled by llguidance here
(`SamplingParams.constraint`, sampling/constraint.py), and each branch then follows it
with a matcher of its own.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from llama_srb.api.errors import APIError
from llama_srb.api.schemas.sampling import SamplingFields
from llama_srb.engine.build import Submission, build
from llama_srb.engine.spec import RequestSpec, branch_count
from llama_srb.native import Model, vocab_error
from llama_srb.sampling.constraint import ConstraintKind, ConstraintSpec, constraints_for
from llama_srb.sampling.grammar import MAX_GRAMMAR_REPEAT
from llama_srb.sampling.params import ParamError, SamplingParams
from llama_srb.sampling.schema_bounds import ANY_JSON_OBJECT
from llama_srb.served import Served, Tokenizer

# Without max_tokens a reply may take what fits in the context, up to this many tokens:
# each branch's tokens are reserved in the KV cache when its request is admitted, so an
# uncapped default would hold the whole context for one request and make the rest wait.
DEFAULT_MAX_TOKENS_CAP = 2048


def request_params(
    body: SamplingFields, model: Model, n_ctx: int, **overrides: Any
) -> SamplingParams:
    """The request's SamplingParams, its constraints included; ParamError when invalid."""
    spec = constraint_spec(body)
    params = body.sampling_params(
        logit_bias=logit_bias(body.logit_bias, model.n_vocab, _text_tokens(model)),
        constraint=constraints_for(model).compile(spec) if spec is not None else None,
        **overrides,
    )
    params.check_model_limits(model.n_vocab, n_ctx)
    return params


def _text_tokens(model: Tokenizer) -> Callable[[str], list[int]]:
    return lambda text: model.tokenize(text, add_special=False, parse_special=False)


def default_max_tokens(n_ctx: int, prompt_len: int, n_branches: int) -> int:
    """What fits: the context left after the prompt, shared by the branches, capped.
    At least 1, so that a prompt that leaves no room gets the context-length error."""
    fits = (n_ctx - prompt_len) // max(n_branches, 1)
    return max(1, min(fits, DEFAULT_MAX_TOKENS_CAP))


def with_default_length(
    params: SamplingParams, body: SamplingFields, n_ctx: int, prompt_len: int
) -> SamplingParams:
    """`params` with the length a request that does not say gets: what fits beside the
    prompt, shared by the branches its request will decode. Those are counted as the
    engine counts them (engine/spec.py `branch_count`, on these very parameters: a greedy
    request decodes one branch for all its choices)."""
    n_branches = branch_count(body.n, body.best_of, params.deterministic)
    max_tokens = default_max_tokens(n_ctx, prompt_len, n_branches)
    return dataclasses.replace(params, max_tokens=max_tokens)


# -- the engine requests --------------------------------------------------------------


def build_all(loaded: Served, specs: Sequence[RequestSpec]) -> list[Submission]:
    """One engine request per spec, its sampler chains built (a worker thread's job); if
    any cannot be, none is kept."""
    for spec in specs:
        _check_fits(spec, loaded.n_ctx)
    built: list[Submission] = []
    try:
        for spec in specs:
            built.append(build(loaded.model, spec))
    except BaseException:
        for submission in built:
            submission.close()
        raise
    return built


class ContextTooSmall(APIError):
    """A request whose prompt and branches cannot be in the context at once: `need` cells
    (`prompt` + `branches` times `max_tokens`), of `n_ctx`. A prompt's cells shared with
    another request's are cells of this context all the same, so a fork is held to it too
    (routes/live.py words it for a fork)."""

    def __init__(self, need: int, prompt: int, branches: int, max_tokens: int, n_ctx: int):
        self.need, self.prompt, self.branches = need, prompt, branches
        self.max_tokens, self.n_ctx = max_tokens, n_ctx
        super().__init__(
            400,
            f"this request needs {need} tokens of context ({prompt} in the prompt +"
            f" {branches} branches × max_tokens={max_tokens}) but the server has {n_ctx};"
            " shorten the prompt or lower n, best_of or max_tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )


def _check_fits(spec: RequestSpec, n_ctx: int) -> None:
    if not spec.prompt:
        raise APIError(400, "the prompt is empty", param="prompt")
    if spec.cells_needed > n_ctx:
        raise ContextTooSmall(
            spec.cells_needed, len(spec.prompt), spec.n_branches, spec.params.max_tokens, n_ctx
        )


# -- what constrains the output: a grammar, logit bias --------------------------------

MAX_BIAS = 100.0  # OpenAI's range: ±100, where -100 bans a token and 100 all but forces it
# Each branch's chain holds a copy; more entries than this is a vocabulary dump, not a bias.
MAX_BIAS_ENTRIES = 4096
MAX_BIAS_TEXT = 512  # a text in llama.cpp's list form is tokenized: bounded like a stop


def constraint_spec(body: SamplingFields) -> ConstraintSpec | None:
    """What the output must match, from whichever one constraint field was given.
    An empty grammar is none (SillyTavern sends `grammar: ""` when it has none)."""
    fmt = _json_format(body)
    given = [
        (name, value)
        for name, value in (
            ("grammar", body.grammar or None),
            ("response_format", fmt),
            ("json_schema", body.json_schema),
            ("guided_regex", body.guided_regex),
            ("guided_grammar", body.guided_grammar or None),
        )
        if value is not None
    ]
    if len(given) > 1:
        names = ", ".join(name for name, _ in given)
        raise ParamError(given[1][0], f"give only one of {names}")
    if not given:
        return None
    param, value = given[0]
    if isinstance(value, dict):
        _check_repetitions(value, param)
        return ConstraintSpec(ConstraintKind.JSON_SCHEMA, value or ANY_JSON_OBJECT, param)
    if param == "guided_regex":
        return ConstraintSpec(ConstraintKind.REGEX, value, param)
    if param == "guided_grammar":  # Lark or GBNF, told apart as vLLM's llguidance does
        kind = ConstraintKind.LARK if is_lark(value) else ConstraintKind.GBNF
        return ConstraintSpec(kind, value, param)
    return ConstraintSpec(ConstraintKind.GBNF, value, param)


def is_lark(grammar: str) -> bool:
    """Whether a grammar is in Lark syntax: it says `%llguidance` or has a `start:` rule."""
    return re.search(r"(?m)^\s*(%llguidance\b|start\s*:)", grammar) is not None


def _json_format(body: SamplingFields) -> dict[str, Any] | None:
    """The schema `response_format` asks for: None for text, {} for any JSON object."""
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return fmt.schema_ or {}
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise ParamError(
            "response_format",
            "response_format of type json_schema needs `json_schema: {name, schema}`",
        )
    return fmt.json_schema.schema_


# Schema keywords that ask for that many items, each a step of the grammar.
_REPEATING_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems")


def _check_repetitions(schema: object, param: str) -> None:
    """ParamError when a keyword asks for more items than a grammar may repeat."""
    stack = [schema]
    while stack:  # not recursive: the nesting is the client's choice
        node = stack.pop()
        if isinstance(node, dict):
            for key in _REPEATING_KEYWORDS:
                value = node.get(key)
                if value is None:
                    continue
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise ParamError(param, f"`{key}` in the JSON schema must be an integer ≥ 0")
                if value > MAX_GRAMMAR_REPEAT:
                    raise ParamError(
                        param,
                        f"`{key}: {value}` in the JSON schema is too large: at most"
                        f" {MAX_GRAMMAR_REPEAT}",
                    )
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


RawBias = dict[str, float | bool] | list[Any] | None


def logit_bias(
    raw: RawBias, n_vocab: int, tokenize: Callable[[str], list[int]] | None = None
) -> tuple[tuple[int, float], ...]:
    """The bias as (id, bias) pairs, checked: an id out of range would crash llama.cpp, and
    a bias outside ±100 is what OpenAI refuses too. OpenAI's `{"token id": bias}`, or
    llama.cpp's `[[token id or text, bias], ...]` where a text stands for each of its
    tokens; `false` as a bias bans the token (-100)."""
    if not raw:
        return ()
    entries: list[tuple[int | str, object]]
    if isinstance(raw, dict):
        entries = [(_token_id(key), bias) for key, bias in raw.items()]
    else:
        entries = [_pair(item) for item in raw]
    if len(entries) > MAX_BIAS_ENTRIES:
        raise ParamError(
            "logit_bias", f"logit_bias has {len(entries)} entries; at most {MAX_BIAS_ENTRIES}"
        )
    pairs: list[tuple[int, float]] = []
    for key, bias in entries:
        value = _bias(bias)
        if isinstance(key, str):
            if tokenize is None:
                raise ParamError("logit_bias", "logit_bias texts are not taken here")
            pairs += [(token, value) for token in tokenize(key)]
            continue
        error = vocab_error([key], n_vocab)
        if error is not None:
            raise ParamError("logit_bias", f"logit_bias: {error}")
        pairs.append((key, value))
    if len(pairs) > MAX_BIAS_ENTRIES:
        raise ParamError(
            "logit_bias", f"logit_bias covers {len(pairs)} tokens; at most {MAX_BIAS_ENTRIES}"
        )
    return tuple(pairs)


def _token_id(key: str) -> int:
    try:
        return int(key)
    except ValueError:
        raise ParamError("logit_bias", f"logit_bias keys are token ids, got {key!r}") from None


_PAIR = "logit_bias entries are [token id or text, bias] pairs"


def _pair(item: object) -> tuple[int | str, object]:
    if not isinstance(item, list) or len(item) != 2:
        raise ParamError("logit_bias", f"{_PAIR}, got {item!r:.80}")
    key, bias = item
    if isinstance(key, bool) or not isinstance(key, int | str):
        raise ParamError("logit_bias", f"{_PAIR}, got {item!r:.80}")
    if isinstance(key, str) and len(key) > MAX_BIAS_TEXT:
        raise ParamError("logit_bias", f"logit_bias texts must be at most {MAX_BIAS_TEXT} chars")
    return key, bias


def _bias(bias: object) -> float:
    if bias is False:
        return -MAX_BIAS  # llama.cpp's "never this token"
    if isinstance(bias, bool) or not isinstance(bias, int | float):
        raise ParamError("logit_bias", f"a logit_bias bias is a number or false, got {bias!r}")
    if not math.isfinite(bias) or abs(bias) > MAX_BIAS:
        raise ParamError("logit_bias", f"logit_bias biases must be in [-100, 100], got {bias}")
    return float(bias)
