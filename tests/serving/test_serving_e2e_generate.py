"""End to end on the real tritonserver: HTTP generate / generate_stream, gRPC streaming, equality with
`dflash-trt generate`, stop words and seeded sampling (tiny random engine, SmolLM2 tokenizer)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dflash_trt.serving.client import GrpcStream, generate, generate_stream, join_text
from dflash_trt.serving.detokenize import decode

pytestmark = pytest.mark.slow

PROMPT = "Write a short poem about the sea, with émojis 🌊 and 日本語."


def test_http_generate_returns_the_text_and_its_statistics(triton):
    out = generate(triton.config.http_url, PROMPT, 24, exclude_input_in_output=True)
    assert out["finish_reason"] == "length" and out["num_output_tokens"] == 24
    # 23 verify steps after the prefill token (random drafts are never accepted), block 8 pinned; a step
    # with r tokens left verifies at most r drafts (its block shrinks to r + 1 slots).
    assert out["total_draft_tokens"] == sum(min(7, left) for left in range(1, 24))
    assert 0.0 <= out["acceptance_rate"] <= 1.0 and out["text_output"]


def test_the_prompt_is_echoed_unless_excluded(triton):
    echoed = generate(triton.config.http_url, PROMPT, 8)
    plain = generate(triton.config.http_url, PROMPT, 8, exclude_input_in_output=True)
    assert echoed["text_output"] == PROMPT + plain["text_output"]


def test_http_stream_sends_chunks_that_add_up_to_the_same_answer(triton):
    whole = generate(triton.config.http_url, PROMPT, 32, exclude_input_in_output=True)
    chunks = list(generate_stream(triton.config.http_url, PROMPT, 32))
    assert len(chunks) > 1 and all(c["finish_reason"] == "" for c in chunks[:-1])
    assert chunks[-1]["finish_reason"] == "length" and chunks[-1]["num_output_tokens"] == 32
    assert join_text(chunks) == whole["text_output"]


def test_grpc_streaming_with_tritonclient(triton):
    stream = GrpcStream(triton.config.grpc_url)
    try:
        chunks = list(stream.chunks(PROMPT, 32))
    finally:
        stream.close()
    whole = generate(triton.config.http_url, PROMPT, 32, exclude_input_in_output=True)
    assert join_text(chunks) == whole["text_output"]
    assert [c["num_output_tokens"] for c in chunks] == sorted(c["num_output_tokens"] for c in chunks)


def test_greedy_output_equals_dflash_trt_generate(triton, tiny_engine, smollm2_tokenizer):
    command = [sys.executable, "-m", "dflash_trt.cli", "generate", "--target", str(tiny_engine / "target"),
               "--drafter", str(tiny_engine / "drafter"), "--prompt", PROMPT, "--max-new-tokens", "40", "--json"]
    reference = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
    served = generate(triton.config.http_url, PROMPT, 40, exclude_input_in_output=True)
    token_ids = reference["token_ids"]
    if reference["finish_reason"] == "stop":
        token_ids = token_ids[:-1]  # the served answer leaves the end token out
    assert served["text_output"] == decode(smollm2_tokenizer, token_ids)
    assert served["num_output_tokens"] == len(token_ids)
    assert served["total_accepted_draft_tokens"] == reference["num_accepted_tokens"]


def test_end_id_ends_the_answer_there_and_minus_one_disables_end_ids(triton, tiny_engine):
    command = [sys.executable, "-m", "dflash_trt.cli", "generate", "--target", str(tiny_engine / "target"),
               "--drafter", str(tiny_engine / "drafter"), "--prompt", PROMPT, "--max-new-tokens", "24", "--json",
               "--stop-ids", ""]
    token_ids = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()[-1])["token_ids"]
    end = token_ids[12]
    ended = generate(triton.config.http_url, PROMPT, 24, exclude_input_in_output=True, end_id=end)
    assert ended["finish_reason"] == "stop" and ended["num_output_tokens"] == token_ids.index(end)
    unended = generate(triton.config.http_url, PROMPT, 24, exclude_input_in_output=True, end_id=-1)
    assert unended["finish_reason"] == "length" and unended["num_output_tokens"] == 24


def test_a_stop_word_ends_the_answer_before_it(triton):
    text = generate(triton.config.http_url, PROMPT, 40, exclude_input_in_output=True)["text_output"]
    words = text.split()
    stop = " " + words[len(words) // 2]
    out = generate(triton.config.http_url, PROMPT, 40, exclude_input_in_output=True, stop_words=[stop])
    assert out["finish_reason"] == "stop"
    assert text.startswith(out["text_output"]) and stop not in out["text_output"]
    assert len(out["text_output"]) <= text.index(stop)


def test_seeded_sampling_is_reproducible(triton):
    params = dict(temperature=1.0, top_k=50, top_p=0.9, exclude_input_in_output=True)
    first = generate(triton.config.http_url, PROMPT, 16, seed=7, **params)["text_output"]
    again = generate(triton.config.http_url, PROMPT, 16, seed=7, **params)["text_output"]
    other = generate(triton.config.http_url, PROMPT, 16, seed=8, **params)["text_output"]
    assert first == again and first != other
