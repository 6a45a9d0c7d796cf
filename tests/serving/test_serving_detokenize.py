"""Streaming detokenization: chunk texts concatenate to the text of all tokens, whatever the chunking."""

from __future__ import annotations

import random

import pytest

from dflash_trt.serving.detokenize import IncrementalDetokenizer, decode, decode_chunk

TEXTS = [
    "Hello world, this is a test.",
    "Héllo wörld 🎉👍🏽 日本語のテキスト and ok",
    "  leading spaces\n\nnew paragraph\twith tab",
    "emoji family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 math ∑∫√ end",
]


def sentencepiece_style_tokenizer():
    """A tiny Metaspace BPE with byte fallback: decoding a piece alone drops its leading space."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    specials = ["<unk>", "</s>"] + ["<0x%02X>" % i for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(TEXTS * 5, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")


@pytest.fixture(params=["smollm2", "sentencepiece"])
def tokenizer(request):
    if request.param == "smollm2":
        return request.getfixturevalue("smollm2_tokenizer")
    return sentencepiece_style_tokenizer()


def stream(tokenizer, ids, chunk_sizes):
    detok = IncrementalDetokenizer(tokenizer)
    pieces, start = [], 0
    for size in chunk_sizes:
        chunk = ids[start:start + size]
        start += size
        pieces.append(detok.add(chunk, is_final=start >= len(ids)))
    return pieces


def chunkings(n, seed):
    rng = random.Random(seed)
    yield [1] * n
    yield [n]
    for _ in range(5):
        sizes, left = [], n
        while left:
            sizes.append(min(left, rng.randint(1, 6)))
            left -= sizes[-1]
        yield sizes


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_chunks_concatenate_to_the_full_decode(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    expected = decode(tokenizer, ids)
    for sizes in chunkings(len(ids), seed=len(text)):
        pieces = stream(tokenizer, ids, sizes)
        assert "".join(pieces) == expected, f"chunk sizes {sizes}"


@pytest.mark.parametrize("text", TEXTS[1:2] + TEXTS[3:])
def test_no_chunk_carries_a_broken_character(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    for piece in stream(tokenizer, ids, [1] * len(ids)):
        assert "\ufffd" not in piece


def test_decoding_chunks_alone_would_break_the_text(tokenizer):
    # The failure the windowed decoding exists for: per-chunk decoding loses spaces or characters.
    text = TEXTS[1]
    ids = tokenizer.encode(text, add_special_tokens=False)
    naive = "".join(decode(tokenizer, [i]) for i in ids)
    assert naive != decode(tokenizer, ids)


def test_final_chunk_keeps_a_truncated_character(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode("ok 🎉", add_special_tokens=False)
    assert decode_chunk(smollm2_tokenizer, ids[:-1], 0, is_final=True).endswith("\ufffd")
    assert not decode_chunk(smollm2_tokenizer, ids[:-1], 0, is_final=False).endswith("\ufffd")


def test_rejects_a_context_longer_than_the_window(smollm2_tokenizer):
    with pytest.raises(ValueError, match="num_context_tokens"):
        decode_chunk(smollm2_tokenizer, [1, 2], 3, is_final=False)
