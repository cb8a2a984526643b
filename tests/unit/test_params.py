import pytest

from llama_srb.api.schemas.completions import CompletionRequest
from llama_srb.sampling.params import ParamError, SamplingParams


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_p", 1.5),
        ("temperature", -1.0),
        ("max_tokens", -1),
        ("min_p", 2.0),
        ("mirostat", 3),
        ("top_k", -2),
        ("logprobs", 21),
        ("temperature", float("nan")),
        # divisors of the logits: near 0 they make them inf, the row's weights NaN
        ("temperature", 5e-324),
        ("temperature", 1e-7),
        ("repeat_penalty", 0.0),
        ("repeat_penalty", 1e-300),
    ],
)
def test_out_of_range_values_name_the_parameter(field: str, value: float) -> None:
    with pytest.raises(ParamError) as info:
        SamplingParams(**{field: value})
    assert info.value.param == field
    assert field in str(info.value)


def test_a_greedy_temperature_and_the_smallest_divisors_are_taken() -> None:
    assert SamplingParams(temperature=0.0).greedy
    assert not SamplingParams(temperature=1e-6, repeat_penalty=1e-6).greedy


def test_request_fields_left_unset_take_the_declared_defaults() -> None:
    params = CompletionRequest(prompt="x", top_k=5, stop="\n").sampling_params()
    assert params.top_k == 5
    assert params.stop == ("\n",)
    assert params.min_p == SamplingParams().min_p
    assert params.max_tokens == 16


def test_empty_stop_string_is_rejected() -> None:
    with pytest.raises(ParamError):
        SamplingParams(stop=("",))
