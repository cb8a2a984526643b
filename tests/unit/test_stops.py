from llama_srb.sampling.stops import StopMatcher


def feed(matcher: StopMatcher, pieces: list[str]) -> str:
    return "".join(matcher.push(p) for p in pieces) + matcher.flush()


def test_no_stops_passes_everything() -> None:
    assert feed(StopMatcher([]), ["a", "b", "c"]) == "abc"


def test_stop_split_across_pieces_never_leaks() -> None:
    m = StopMatcher(["THE END"])
    out = [m.push(p) for p in ["once ", "upon TH", "E E", "ND and more"]]
    assert out == ["once ", "upon ", "", ""]
    assert m.stopped
    assert m.flush() == ""


def test_held_text_is_released_when_it_turns_out_not_to_be_a_stop() -> None:
    m = StopMatcher(["\n\n"])
    assert m.push("line\n") == "line"
    assert m.push("next") == "\nnext"
    assert not m.stopped


def test_earliest_of_several_stops_wins() -> None:
    m = StopMatcher(["xyz", "b"])
    assert m.push("aaxyzb") == "aa"
    assert m.stopped


def test_flush_releases_partial_match_at_end() -> None:
    m = StopMatcher(["STOP"])
    assert m.push("go ST") == "go "
    assert m.flush() == "ST"


def test_unchecked_pushes_ignore_stops() -> None:
    m = StopMatcher(["x"])
    assert m.push("axa", check=False) == "axa"
    assert m.push("bxb") == "b"
    assert m.stopped


def test_every_split_point_of_a_stop_is_caught() -> None:
    text = "hello world. The stop is here."
    stop = "stop is"
    for i in range(1, len(text)):
        for j in range(i + 1, len(text) + 1):
            m = StopMatcher([stop])
            emitted = feed(m, [text[:i], text[i:j], text[j:]])
            assert emitted == "hello world. The ", (i, j)


def test_held_back_suffix_matches_a_brute_force_search() -> None:
    """The longest suffix of the text that is a proper prefix of some stop string."""
    import random

    rng = random.Random(3)
    for _ in range(2000):
        stops = ["".join(rng.choices("ab\n", k=rng.randrange(1, 6))) for _ in range(3)]
        buffer = "".join(rng.choices("ab\n", k=rng.randrange(0, 12)))
        expected = max(
            (k for s in stops for k in range(1, len(s)) if buffer.endswith(s[:k])), default=0
        )
        assert StopMatcher(stops)._partial_suffix(buffer) == expected, (stops, buffer)
