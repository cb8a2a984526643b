"""Chat templates render like Hugging Face's, inside Jinja2's sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from llama_srb.api.input.chat import ChatTemplate, ChatTemplateError

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
