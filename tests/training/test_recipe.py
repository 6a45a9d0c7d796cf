"""The masked training forward must equal the drafter's cache-based inference forward, block by block."""

import pytest
import torch

from dflash_trt.testing import make_tiny_drafter, tiny_target_config
from dflash_trt.training.recipe import attention_mask, build_batch, drafter_block_states, sample_anchors, slot_weights

BLOCK = 4


def _sample(length, prompt_len, kd, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return {"ids": torch.randint(0, vocab, (length,), generator=g, dtype=torch.int32), "prompt_len": prompt_len,
            "features": torch.randn(length, kd, generator=g).to(torch.bfloat16)}


def _setup(family="dflash"):
    cfg = tiny_target_config("llama")
    drafter = make_tiny_drafter(cfg, block_size=BLOCK, num_layers=2, family=family)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size)
    kd = drafter.config.num_target_features * cfg.hidden_size
    samples = [_sample(20, 6, kd, cfg.vocab_size, 1), _sample(13, 5, kd, cfg.vocab_size, 2)]
    anchors = [torch.tensor([6, 9, 15]), torch.tensor([5, 11])]
    batch = build_batch(samples, anchors, BLOCK, drafter.config.mask_token_id, gamma=4.0)
    return drafter, embed, samples, anchors, batch


@pytest.mark.parametrize("family", ["dflash", "dflash2"])
def test_training_forward_matches_cached_inference_per_block(family):
    drafter, embed, samples, anchors, batch = _setup(family)
    with torch.no_grad():
        states = drafter_block_states(drafter, embed, batch)
        for b, (s, a) in enumerate(zip(samples, anchors)):
            for n, anchor in enumerate(a.tolist()):
                cache = drafter.new_cache(1, 64)
                feats = s["features"][:anchor].float()[None]
                tokens = torch.full((1, BLOCK), drafter.config.mask_token_id)
                tokens[0, 0] = int(s["ids"][anchor])
                ref = drafter(embed[tokens], feats, torch.tensor([anchor]), cache)
                got = states[b, n * BLOCK:(n + 1) * BLOCK]
                torch.testing.assert_close(got, ref[0], rtol=1e-4, atol=1e-4)


def test_blocks_see_only_context_before_their_anchor_and_their_own_slots():
    _, _, _, _, batch = _setup()
    mask = attention_mask(batch)[0, 0]  # first sequence, T = 20 context columns, then 3 blocks of 4
    T = 20
    first_slot_of_block2 = 1 * BLOCK
    assert mask[first_slot_of_block2, :9].all() and not mask[first_slot_of_block2, 9:T].any()
    own = mask[first_slot_of_block2, T:]
    assert own.tolist() == [False] * BLOCK + [True] * BLOCK + [False] * BLOCK


def test_labels_are_same_position_tokens_with_decaying_weights():
    _, _, samples, _, batch = _setup()
    ids = samples[1]["ids"].long()
    assert batch["labels"][1, :BLOCK].tolist() == ids[5:5 + BLOCK].tolist()
    assert batch["block_tokens"][1, 0] == ids[5] and (batch["block_tokens"][1, 1:BLOCK] != ids[6:9]).any()
    w = slot_weights(BLOCK, 4.0)
    assert w[0] == 0 and w[1] == 1 and torch.all(w[2:] < w[1:-1])
    # Second block of sequence 1 starts at 11 of 13 tokens: slots past the end carry no weight.
    assert batch["weights"][1, BLOCK + 2:2 * BLOCK].eq(0).all()
    # Padding block of sequence 1 (it has 2 anchors, sequence 0 has 3) carries no weight.
    assert batch["weights"][1, 2 * BLOCK:].eq(0).all()


def test_anchors_are_response_positions_with_a_label():
    g = torch.Generator().manual_seed(0)
    a = sample_anchors(prompt_len=10, length=30, num_blocks=50, generator=g)
    assert len(a) == 19 and a.min() >= 10 and a.max() <= 28 and len(set(a.tolist())) == 19
