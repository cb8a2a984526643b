from llama_srb.sampling.detok import IncrementalDetokenizer
from llama_srb.sampling.text import TextStream

PIECES = {1: "Hé".encode(), 2: "🙂".encode()[:2], 3: "🙂".encode()[2:], 4: b" ok", 5: b"\xff"}


def test_multibyte_character_split_across_tokens_is_held() -> None:
    d = IncrementalDetokenizer(PIECES.__getitem__)
    assert d.push(1) == "Hé"
    assert d.push(2) == ""
    assert d.push(3) == "🙂"
    assert d.push(4) == " ok"
    assert d.flush() == ""


def test_incomplete_bytes_at_the_end_become_replacement_characters() -> None:
    d = IncrementalDetokenizer(PIECES.__getitem__)
    d.push(2)
    assert d.flush() == "\ufffd"


def test_text_stream_combines_detok_and_stops() -> None:
    stream = TextStream(PIECES.__getitem__, stops=["🙂 o"])
    assert stream.push(1, True) == "Hé"
    assert stream.push(2, True) == ""
    assert stream.push(3, True) == ""  # "🙂" might start the stop string
    assert stream.push(4, True) == ""
    assert stream.stopped
    assert stream.flush() == ""
