"""From decoding steps to response chunks: streaming, end ids, stop words, statistics, cancellation."""

from __future__ import annotations

import pytest

from dflash_trt.serving.detokenize import decode, decode_chunk
from dflash_trt.serving.generation import Cancelled, Stats, Step, chunks, until_cancelled
from dflash_trt.serving.requests import GenerationRequest

END = 2


def steps_for(tokens_per_step, finish="length"):
    """Steps committing the given token lists; the first is the prefill token (no acceptance)."""
    out = []
    for i, tokens in enumerate(tokens_per_step):
        last = i == len(tokens_per_step) - 1
        out.append(Step(list(tokens), None if i == 0 else len(tokens), last, finish if last else ""))
    return out


def run(tokenizer, request, prompt, step_list, block_size=4, end_ids=(END,)):
    stats = Stats(block_size)
    return list(chunks(request, prompt, step_list, tokenizer, stats, end_ids)), stats


@pytest.fixture
def ids(smollm2_tokenizer):
    return smollm2_tokenizer.encode(" Hello wörld 🎉, how are you today?", add_special_tokens=False)


def test_streaming_sends_one_chunk_per_step_and_the_text_adds_up(smollm2_tokenizer, ids):
    groups = [ids[:1], ids[1:4], ids[4:6], ids[6:]]
    out, stats = run(smollm2_tokenizer, GenerationRequest("x", 64, stream=True), [5, 6], steps_for(groups))
    assert [c.new_token_ids for c in out] == groups
    assert [c.is_final for c in out] == [False, False, False, True] and out[-1].finish_reason == "length"
    text = "".join(decode_chunk(smollm2_tokenizer, c.window_ids, c.num_context_tokens, c.is_final) for c in out)
    assert text == decode(smollm2_tokenizer, ids)
    assert stats.num_output_tokens == len(ids)


def test_without_streaming_one_chunk_carries_everything(smollm2_tokenizer, ids):
    request = GenerationRequest("x", 64, exclude_input_in_output=True)
    out, _ = run(smollm2_tokenizer, request, [5, 6], steps_for([ids[:1], ids[1:5], ids[5:]]))
    assert len(out) == 1 and out[0].is_final
    assert out[0].window_ids == ids and out[0].num_context_tokens == 0


def test_the_prompt_is_echoed_unless_excluded_as_in_tensorrt_llm(smollm2_tokenizer, ids):
    out, _ = run(smollm2_tokenizer, GenerationRequest("x", 64), [5, 6], steps_for([ids[:1], ids[1:]]))
    assert out[0].window_ids == [5, 6] + ids
    streamed, _ = run(smollm2_tokenizer, GenerationRequest("x", 64, stream=True), [5, 6], steps_for([ids]))
    assert streamed[0].window_ids == ids  # streaming never repeats the prompt


def test_the_end_id_is_not_part_of_the_output(smollm2_tokenizer, ids):
    out, stats = run(smollm2_tokenizer, GenerationRequest("x", 64, exclude_input_in_output=True), [5],
                     steps_for([ids[:1], ids[1:3] + [END]], finish="stop"))
    assert out[-1].finish_reason == "stop" and out[-1].window_ids == ids[:3]
    assert stats.num_output_tokens == 3


def test_a_stop_word_ends_generation_before_it(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode("The answer.\nUser: more text", add_special_tokens=False)
    request = GenerationRequest("x", 64, stream=True, stop_words=("User:",))
    out, stats = run(smollm2_tokenizer, request, [5], steps_for([ids[:1], ids[1:4], ids[4:]]))
    assert out[-1].is_final and out[-1].finish_reason == "stop"
    text = "".join(decode_chunk(smollm2_tokenizer, c.window_ids, c.num_context_tokens, c.is_final) for c in out)
    assert text == "The answer.\n"
    assert stats.num_output_tokens == len(smollm2_tokenizer.encode("The answer.\n", add_special_tokens=False))


def test_statistics_count_drafts_and_accepted_tokens_per_verify_step():
    stats = Stats(block_size=8)
    for length in (None, 3, 1, 8):
        stats.add_step(length)
    assert (stats.num_spec_steps, stats.total_draft_tokens, stats.total_accepted_draft_tokens) == (3, 21, 9)
    assert stats.acceptance_rate == pytest.approx(9 / 21) and stats.tau == pytest.approx(4.0)
    stats.add_step(2, num_draft_tokens=3)  # a runtime that drafts fewer tokens reports its own count
    assert stats.total_draft_tokens == 24


def test_cancellation_is_checked_between_steps_only():
    flags = iter([False, True])
    checked = until_cancelled(steps_for([[1], [2], [3]]), lambda: next(flags))
    assert next(checked).new_token_ids == [1]
    assert next(checked).new_token_ids == [2]
    with pytest.raises(Cancelled):
        next(checked)


def test_a_finished_generation_is_not_reported_cancelled():
    checked = until_cancelled(steps_for([[1]]), lambda: True)
    assert [s.new_token_ids for s in checked] == [[1]]
