"""Features captured during batched generation equal a separate forward over the finished sequence."""

import torch

from dflash_trt.testing import make_tiny_target
from dflash_trt.training.answers import generation_features, trim_response
from dflash_trt.training.features import target_features

LAYER_IDS = (1, 3)


def test_generation_features_match_a_full_forward():
    model = make_tiny_target("llama")
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
    width = max(map(len, prompts))
    input_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        gen = model.generate(input_ids=input_ids, attention_mask=attn, max_new_tokens=6, do_sample=False,
                             pad_token_id=0, output_hidden_states=True, return_dict_in_generate=True)
    recs = [{"ids": p + trim_response(row, 0, (-1,)), "prompt_len": len(p)}
            for p, row in zip(prompts, gen.sequences[:, width:].tolist())]
    got = generation_features(gen.hidden_states, LAYER_IDS, width, recs)
    want = target_features(model, [r["ids"] for r in recs], LAYER_IDS)
    for g, w, r in zip(got, want, recs):
        assert g.shape == w.shape == (len(r["ids"]), 2 * model.config.hidden_size)
        torch.testing.assert_close(g[:-1], w[:-1], rtol=1e-4, atol=1e-4)
        assert g[-1].eq(0).all()  # the last token is never fed, and training never reads it
