"""A client's JSON schema as llama.cpp's converter (json-schema-to-grammar) reads it, so that
every answer can close: objects that list their properties have no others, numbers have a
bounded count of digits, strings a bounded length, unless the schema says otherwise.

llguidance follows JSON Schema's own defaults (any extra key, any number of digits, any
length), and a small model takes them: `"age": 4000000000000000000000…` until max_tokens.
Its compiler has no option for a digit bound, so the bounds are written into the schema
as the keywords it does implement (`minimum`/`maximum`, `multipleOf`, `maxLength`)."""

from __future__ import annotations

import json
from typing import Any

from llama_srb.sampling.grammar import MAX_GRAMMAR_REPEAT

# llama.cpp's converter: at most 16 digits before the point (10**16 is exact as the float
# llguidance reads a bound as). After it llama.cpp allows 16; llguidance's `multipleOf`
# takes at most 10 (a finer step has "too many digits").
NUMBER_BOUND = 10**16
FRACTION_STEP = 1e-10
# A string with no bound of its own: the most a client's `maxLength` may ask for.
STRING_LENGTH = MAX_GRAMMAR_REPEAT

# The keywords whose values are schemas, lists of schemas, or maps of names to schemas.
_SCHEMA = ("additionalProperties", "items", "not", "if", "then", "else", "contains")
_SCHEMAS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_NAMED_SCHEMAS = ("properties", "patternProperties", "$defs", "definitions")
# A value fixed by these needs no bound; a string shaped by these gets none added.
_FIXED = ("enum", "const")
_SHAPED_STRING = ("maxLength", "pattern", "format")


# `json_object`: any object, its values bounded as any schema's are (JSON Schema's "any
# value" is a node without a type, which no default reaches).
_VALUE = {"$ref": "#/$defs/value"}
ANY_JSON_OBJECT: dict[str, Any] = {
    "type": "object",
    "additionalProperties": _VALUE,
    "$defs": {
        "value": {
            "anyOf": [
                {"type": ["null", "boolean", "number", "string"]},
                {"type": "array", "items": _VALUE},
                {"type": "object", "additionalProperties": _VALUE},
            ]
        }
    },
}


def as_llama_cpp_reads(schema: dict[str, Any]) -> dict[str, Any]:
    """A bounded copy of `schema`; the client's schema is left as sent."""
    copy: dict[str, Any] = json.loads(json.dumps(schema))
    stack: list[object] = [copy]
    while stack:  # not recursive: the nesting is the client's
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        _bound(node)
        stack += [node[key] for key in _SCHEMA if key in node]
        stack += [s for key in _SCHEMAS if isinstance(node.get(key), list) for s in node[key]]
        stack += [
            s
            for key in _NAMED_SCHEMAS
            if isinstance(node.get(key), dict)
            for s in node[key].values()
        ]
    return copy


def _bound(node: dict[str, Any]) -> None:
    """The defaults for one schema node, each only where the node is silent."""
    if isinstance(node.get("properties"), dict):
        node.setdefault("additionalProperties", False)
    if any(key in node for key in _FIXED):
        return
    types = node.get("type")
    types = set(types) if isinstance(types, list) else {types}
    if types & {"integer", "number"}:
        _bound_range(node)
        if "number" in types and "multipleOf" not in node:
            node["multipleOf"] = FRACTION_STEP
    if "string" in types and not any(key in node for key in _SHAPED_STRING):
        node["maxLength"] = STRING_LENGTH


def _bound_range(node: dict[str, Any]) -> None:
    """A finite range: ±NUMBER_BOUND, or NUMBER_BOUND beyond the bound the client gave."""
    low = _number(node, "minimum", "exclusiveMinimum")
    high = _number(node, "maximum", "exclusiveMaximum")
    if low is None:
        node["minimum"] = min(-NUMBER_BOUND, (high or 0) - NUMBER_BOUND)
    if high is None:
        node["maximum"] = max(NUMBER_BOUND, (low or 0) + NUMBER_BOUND)


def _number(node: dict[str, Any], *keys: str) -> float | None:
    for key in keys:
        value = node.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
    return None
