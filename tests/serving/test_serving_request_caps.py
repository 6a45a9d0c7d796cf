"""Caps on what one request may cost before it is refused: prompt bytes (checked before tokenizing), word
lists (count and bytes per entry), input_ids length; and request parameters (misspelt /generate fields)."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_trt.serving.preprocess import Preprocessor
from dflash_trt.serving.requests import (BYTES_PER_TOKEN_BOUND, MAX_WORD_BYTES, MAX_WORDS, InvalidRequest,
                                         RequestLimits, check_parameters, parse_request, parse_token_request)
from dflash_trt.serving.triton_io import request_parameters

LIMITS = RequestLimits(max_tokens=64, max_context_tokens=128)


def inputs(text: bytes = b"Hello", **overrides):
    arrays = {"text_input": np.array([text], dtype=object), "max_tokens": np.array([8], dtype=np.int32)}
    arrays.update(overrides)
    return arrays


def test_the_prompt_byte_limit_derives_from_the_context_unless_set():
    assert LIMITS.prompt_bytes_limit == 128 * BYTES_PER_TOKEN_BOUND
    assert RequestLimits(max_context_tokens=128, max_prompt_bytes=1000).prompt_bytes_limit == 1000


def test_a_prompt_over_the_byte_limit_is_refused_naming_both_sizes():
    limit = LIMITS.prompt_bytes_limit
    parse_request(inputs(b"a" * limit), LIMITS)  # at the limit: accepted (the token count decides later)
    with pytest.raises(InvalidRequest, match=rf"text_input is {limit + 1} bytes; this server accepts at most "
                                             rf"{limit} bytes \(max_prompt_bytes"):
        parse_request(inputs(b"a" * (limit + 1)), LIMITS)


class CountingTokenizer:
    """Counts encode calls: an oversized prompt must be refused before the tokenizer sees it."""

    chat_template = None

    def __init__(self):
        self.calls = 0

    def encode(self, text):
        self.calls += 1
        return [1] * len(text.split())


def test_an_oversized_prompt_never_reaches_the_tokenizer():
    tokenizer = CountingTokenizer()
    preprocessor = Preprocessor(tokenizer, LIMITS)
    huge = b"word " * (LIMITS.prompt_bytes_limit // 5 + 1)
    with pytest.raises(InvalidRequest, match="max_prompt_bytes"):
        preprocessor.prompt_ids(parse_request(inputs(huge), LIMITS))
    assert tokenizer.calls == 0
    assert preprocessor.prompt_ids(parse_request(inputs(b"two words"), LIMITS)) == [1, 1]
    assert tokenizer.calls == 1


@pytest.mark.parametrize("name", ["stop_words", "bad_words"])
def test_word_lists_are_capped_in_count_and_bytes(name):
    at_cap = [b"w%d" % i for i in range(MAX_WORDS)]
    request = parse_request(inputs(**{name: np.array(at_cap, dtype=object)}), LIMITS)
    assert len(getattr(request, name)) == MAX_WORDS
    with pytest.raises(InvalidRequest, match=rf"{name} has {MAX_WORDS + 1} entries; at most {MAX_WORDS}"):
        parse_request(inputs(**{name: np.array(at_cap + [b"one more"], dtype=object)}), LIMITS)
    long_word = "é" * (MAX_WORD_BYTES // 2 + 1)  # counted in UTF-8 bytes, not characters
    with pytest.raises(InvalidRequest, match=rf"{name}\[1\] is {MAX_WORD_BYTES + 2} bytes; each entry may have at "
                                             rf"most {MAX_WORD_BYTES}"):
        parse_request(inputs(**{name: np.array([b"ok", long_word.encode()], dtype=object)}), LIMITS)


def test_input_ids_longer_than_the_context_are_refused_before_any_per_token_work():
    arrays = {"input_ids": np.zeros(LIMITS.max_context_tokens + 1, dtype=np.int32),
              "max_tokens": np.array([1], dtype=np.int32)}
    with pytest.raises(InvalidRequest, match="input_ids has 129 tokens; the model's context is 128"):
        parse_token_request(arrays, LIMITS, vocab_size=10)


def test_request_parameters_are_refused_with_a_hint_for_a_misspelt_input():
    check_parameters({})
    with pytest.raises(InvalidRequest, match=r"unknown field\(s\) 'max_token' \(did you mean 'max_tokens'\?\), "
                                             r"'zzz': not an input of this model"):
        check_parameters({"zzz": 1, "max_token": 8})


class ParamRequest:
    def __init__(self, raw):
        self.raw = raw

    def parameters(self):
        return self.raw


def test_request_parameters_are_read_from_the_backends_json_string():
    assert request_parameters(ParamRequest('{"bogus": 1}')) == {"bogus": 1}
    assert request_parameters(ParamRequest("{}")) == {}
    assert request_parameters(object()) == {}  # an older backend without parameters()
