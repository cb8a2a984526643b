"""Chat templates render like Hugging Face's, inside Jinja2's sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from llama_srb.api.errors import APIError
from llama_srb.api.input.chat import ChatTemplate, ChatTemplateError, render_folded
from llama_srb.api.input.turns import alternating, system_in_first_user

TOY = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
    "<{{ m['role'] }}>{{ m['content'] }}</s>\n"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)
GEMMA = Path(__file__).parents[1] / "data" / "gemma3_chat_template.jinja"


def test_renders_messages_bos_and_generation_prompt() -> None:
    template = ChatTemplate(TOY, bos_token="<s>", eos_token="</s>")
    messages = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"}]
    assert template.render(messages) == "<s><system>Be kind.</s>\n<user>Hi</s>\n<assistant>"
    assert template.render(messages, add_generation_prompt=False).endswith("<user>Hi</s>\n")


def test_gemma_template_as_hugging_face_renders_it() -> None:
    template = ChatTemplate(GEMMA.read_text(), bos_token="<bos>", eos_token="<eos>")
    text = template.render(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "More"},
        ]
    )
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nMore<end_of_turn>\n<start_of_turn>model\n"
    )


def test_raise_exception_becomes_a_clear_error() -> None:
    template = ChatTemplate(TOY)
    with pytest.raises(ChatTemplateError, match="rejected the messages: no tools here"):
        template.render([{"role": "tool", "content": "x"}])


def test_syntax_errors_name_the_line() -> None:
    with pytest.raises(ChatTemplateError, match=r"does not compile: .*\(line 2\)"):
        ChatTemplate("ok\n{% for m in messages %}")


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.__class__.__mro__ }}",  # Python internals: blocked by the sandbox
        "{{ messages.append({'role': 'user'}) }}",  # the immutable sandbox forbids mutation
        "{{ undefined_function() }}",
    ],
)
def test_unsafe_or_broken_templates_fail_cleanly(source: str) -> None:
    with pytest.raises(ChatTemplateError, match="the chat template failed"):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


def test_tojson_keeps_non_ascii_text() -> None:
    template = ChatTemplate("{{ messages[0]['content'] | tojson }}")
    assert template.render([{"role": "user", "content": "café"}]) == '"café"'


# -- messages folded into turns a strict template accepts (input/turns.py) ------------------

# SillyTavern's Chat Completion (Custom source) list: its prompt manager's system messages
# (openai.js populateChatCompletion: main prompt, character, scenario), the greeting as the
# assistant's first message, then the user (public/scripts/openai.js, default prompt order).
SILLYTAVERN = [
    {"role": "system", "content": "Write Seraphina's next reply in a fictional chat."},
    {"role": "system", "content": "Seraphina is a guardian of the forest."},
    {"role": "system", "content": "[Start a new Chat]"},
    {"role": "assistant", "content": "*You wake in a glade.* Are you hurt?"},
    {"role": "user", "content": "Where am I?"},
]
# A template with no system role at all, as older Mistral ones.
NO_SYSTEM = (
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
    "[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
)


def _render(source: str, messages: list[dict[str, str]]) -> tuple[list[dict[str, str]], str]:
    return render_folded(ChatTemplate(source, "<bos>"), messages, "\x00slot:", lambda _: False)


def test_a_template_that_takes_the_messages_gets_them_as_sent() -> None:
    messages, _ = _render(TOY, SILLYTAVERN)
    assert messages == SILLYTAVERN


def test_sillytaverns_list_folded_for_gemma() -> None:
    messages, text = _render(GEMMA.read_text(), SILLYTAVERN)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert text == (
        "<bos><start_of_turn>user\nWrite Seraphina's next reply in a fictional chat.\n\n"
        "Seraphina is a guardian of the forest.\n\n[Start a new Chat]\n\n<end_of_turn>\n"
        "<start_of_turn>model\n*You wake in a glade.* Are you hurt?<end_of_turn>\n"
        "<start_of_turn>user\nWhere am I?<end_of_turn>\n<start_of_turn>model\n"
    )


def test_consecutive_turns_joined_and_late_system_messages_made_user() -> None:
    sent = [
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "c"},
        {"role": "system", "content": "d"},
        {"role": "user", "content": "e"},
    ]
    assert alternating(sent) == [
        {"role": "user", "content": "a\n\nb"},
        {"role": "assistant", "content": "c"},
        {"role": "user", "content": "d\n\ne"},
    ]
    messages, _ = _render(GEMMA.read_text(), sent)
    assert messages == alternating(sent)


def test_a_template_without_a_system_role_gets_it_in_the_first_user_turn() -> None:
    messages, text = _render(NO_SYSTEM, SILLYTAVERN)
    assert messages == system_in_first_user(SILLYTAVERN)
    assert text.startswith("[user]Write Seraphina's next reply") and "[Start a new Chat]" in text
    assert text.count("[user]") == 2 and "[assistant]*You wake" in text
    only_system = [{"role": "system", "content": "Be brief."}]
    assert system_in_first_user(only_system) == [{"role": "user", "content": "Be brief."}]


def test_what_no_fold_fixes_is_refused_with_the_templates_words() -> None:
    with pytest.raises(APIError, match="no tools here") as error:
        _render(TOY, [{"role": "tool", "content": "x"}])
    assert error.value.status == 400 and error.value.param == "messages"
