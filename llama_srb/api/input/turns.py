"""Chat messages folded into turns a strict template accepts.

Chat clients send what their user wrote: SillyTavern's Chat Completion sends several
system messages (main prompt, character, scenario), then the character's greeting as
`assistant`, then `user`. Templates such as Gemma's allow one system message, first, and
then strictly alternating turns that start with the user; ones without a system role at
all (Mistral's older ones) reject it anywhere. Each fold below is tried in turn, the
first being the messages as sent, until the template stops rejecting them
(input/chat.py), so a template that takes the list as it is gets it as it is:

1. as sent;
2. alternating: consecutive messages of one role joined (with a blank line between, as
   SillyTavern's own "merge consecutive roles" does), a system message after the
   conversation began made a user message, and an empty user turn put before a
   conversation that starts with the assistant (the system text, if any, stays first);
3. as 2, with the leading system message merged into the first user turn, for templates
   with no system role.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Message = dict[str, str]
JOIN = "\n\n"


def as_sent(messages: Sequence[Message]) -> list[Message]:
    return [dict(m) for m in messages]


def alternating(messages: Sequence[Message]) -> list[Message]:
    started = False  # a user or assistant message has come
    roles: list[Message] = []
    for message in messages:
        role = message["role"]
        if role != "system":
            started = True
        elif started:
            role = "user"
        roles.append({**message, "role": role})
    turns = _joined(roles)
    first = 1 if turns and turns[0]["role"] == "system" else 0
    if first < len(turns) and turns[first]["role"] == "assistant":
        turns.insert(first, {"role": "user", "content": ""})
    return turns


def system_in_first_user(messages: Sequence[Message]) -> list[Message]:
    turns = alternating(messages)
    if not turns or turns[0]["role"] != "system":
        return turns
    system, rest = turns[0], turns[1:]
    if not rest:
        return [{"role": "user", "content": system["content"]}]
    user = rest[0]  # alternating() made it a user turn
    merged = JOIN.join(part for part in (system["content"], user["content"]) if part)
    return [{**user, "content": merged}, *rest[1:]]


def _joined(messages: Sequence[Message]) -> list[Message]:
    turns: list[Message] = []
    for message in messages:
        if turns and turns[-1]["role"] == message["role"]:
            previous = turns[-1]["content"]
            content = JOIN.join(part for part in (previous, message["content"]) if part)
            turns[-1] = {**turns[-1], "content": content}
        else:
            turns.append(dict(message))
    return turns


FOLDS: tuple[Callable[[Sequence[Message]], list[Message]], ...] = (
    as_sent,
    alternating,
    system_in_first_user,
)
