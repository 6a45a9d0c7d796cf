"""Feature cache: features captured during generation equal a full forward; polling reads only new chunks."""

import torch

from dflash_trt.testing import make_tiny_target
from dflash_trt.training.answers import generation_features, trim_response
from dflash_trt.training.features import feature_dir, load_feature_cache, target_features, write_feature_chunk

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


def _chunk(fdir, indices):
    recs = [{"idx": i, "family": "math", "ids": [1, 2, 3, i], "prompt_len": 2} for i in indices]
    write_feature_chunk(fdir, recs, [torch.full((4, 2), float(i)) for i in indices])


def test_a_cache_poll_reads_only_chunks_with_unseen_samples(tmp_path, monkeypatch):
    fdir = feature_dir(tmp_path, LAYER_IDS)
    _chunk(fdir, [0, 1])
    _chunk(fdir, [2, 3])
    everything = load_feature_cache(tmp_path, LAYER_IDS)
    assert [s["idx"] for s in everything] == [0, 1, 2, 3]
    assert everything[3]["features"].eq(3).all() and everything[3]["features"].dtype == torch.bfloat16

    reads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda path, **kw: reads.append(path.name) or real_load(path, **kw))
    assert load_feature_cache(tmp_path, LAYER_IDS, known={0, 1, 2, 3}) == []
    assert reads == []  # nothing new: no chunk is read
    _chunk(fdir, [4, 5])
    assert [s["idx"] for s in load_feature_cache(tmp_path, LAYER_IDS, known={0, 1, 2, 3, 4})] == [5]
    assert reads == ["chunk_000004_2.pt"]
