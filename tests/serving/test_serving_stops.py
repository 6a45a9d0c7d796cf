"""Stop words are matched on text and never leak into the released tokens."""

from __future__ import annotations

import pytest

from dflash_trt.serving.detokenize import decode
from dflash_trt.serving.stops import StopMatcher


def run(tokenizer, text, stop_words):
    matcher = StopMatcher(tokenizer, stop_words)
    released = []
    for token in tokenizer.encode(text, add_special_tokens=False):
        released += matcher.push(token)
        if matcher.stopped:
            break
    else:
        released += matcher.flush()
    return decode(tokenizer, released), matcher.stopped


def test_without_stop_words_every_token_is_released_at_once(smollm2_tokenizer):
    matcher = StopMatcher(smollm2_tokenizer, ())
    assert matcher.push(42) == [42]


@pytest.mark.parametrize(
    "text, stop, expected",
    [
        ("The answer is 42.\nUser: next question", "User:", "The answer is 42.\n"),
        ("one two three four", " three", "one two"),
        ("first paragraph\n\nsecond", "\n\n", "first paragraph"),
        ("emoji 🎉 then more", "🎉", "emoji"),  # " \xf0" is one token: it goes too
    ],
)
def test_output_ends_before_the_stop_word(smollm2_tokenizer, text, stop, expected):
    out, stopped = run(smollm2_tokenizer, text, [stop, "never-seen"])
    assert stopped
    assert out == expected


def test_a_partial_match_is_released_when_the_word_does_not_complete(smollm2_tokenizer):
    out, stopped = run(smollm2_tokenizer, "we say User but not the colon", ["User:"])
    assert not stopped
    assert out == "we say User but not the colon"


def test_text_that_may_start_a_stop_word_is_held_back(smollm2_tokenizer):
    matcher = StopMatcher(smollm2_tokenizer, ["Userland"])
    ids = smollm2_tokenizer.encode("hi User", add_special_tokens=False)
    released = [t for i in ids for t in matcher.push(i)]
    assert decode(smollm2_tokenizer, released) == "hi"


def test_stop_words_without_a_tokenizer_are_a_clear_request_error():
    from dflash_trt.serving.requests import InvalidRequest

    with pytest.raises(InvalidRequest, match="no tokenizer"):
        StopMatcher(None, ["User:"])
    assert StopMatcher(None, []).push(7) == [7]


def test_the_matcher_tells_which_stop_word_ended_the_text(smollm2_tokenizer):
    matcher = StopMatcher(smollm2_tokenizer, ["four", " two", "never-seen"])
    for token in smollm2_tokenizer.encode("one two three four", add_special_tokens=False):
        matcher.push(token)
        if matcher.stopped:
            break
    assert matcher.stop_word == " two"  # the word that starts first, whatever the order of the list
