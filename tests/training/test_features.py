"""Feature cache: length-grouped batches, exact features, and polling that reads only chunks with new samples."""

import torch

from dflash_trt.training.features import feature_dir, load_feature_cache, write_feature_chunk

LAYER_IDS = (1, 3)


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


def test_length_batches_pad_little_and_respect_the_token_budget():
    from dflash_trt.training.features import length_batches

    lengths = [300, 10, 290, 12, 600, 11, 305, 9, 620, 13]
    recs = [{"idx": i, "ids": [0] * n} for i, n in enumerate(lengths)]
    batches = length_batches(recs, max_tokens=700, max_batch=3)
    assert sorted(r["idx"] for b in batches for r in b) == list(range(len(lengths)))  # each record once
    assert [[len(r["ids"]) for r in b] for b in batches] == [[9, 10, 11], [12, 13], [290, 300], [305], [600], [620]]
    assert all(len(b) * max(len(r["ids"]) for r in b) <= 700 for b in batches)
    # Pairs in prompt order would pad each short answer to a long one: about twice the tokens.
    padded = sum(len(b) * max(len(r["ids"]) for r in b) for b in batches)
    assert padded < 0.6 * sum(len(lengths[i:i + 2]) * max(lengths[i:i + 2]) for i in range(0, 10, 2))


def test_cached_features_match_a_forward_of_each_answer_alone(tmp_path):
    import json

    from dflash_trt.testing import make_tiny_target
    from dflash_trt.training.features import cache_features, target_features

    model = make_tiny_target("llama")
    g = torch.Generator().manual_seed(0)
    lengths = [5, 40, 7, 33, 6, 38]
    with open(tmp_path / "answers.0-of-1.jsonl", "w") as f:
        for i, n in enumerate(lengths):
            ids = torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist()
            f.write(json.dumps({"idx": i, "family": "math", "prompt": f"p{i}", "ids": ids, "prompt_len": 2}) + "\n")
    assert cache_features(str(tmp_path), model, LAYER_IDS, max_tokens=100) == len(lengths)
    cached = load_feature_cache(tmp_path, LAYER_IDS)
    assert [s["idx"] for s in cached] == list(range(len(lengths)))
    for s in cached:
        alone = target_features(model, [s["ids"].tolist()], LAYER_IDS)[0].to(torch.bfloat16)
        assert s["features"].shape == alone.shape
        torch.testing.assert_close(s["features"].float(), alone.float(), rtol=1e-2, atol=1e-2)
    # Batched by length: the short answers share one chunk, the long ones another two.
    chunks = sorted(json.loads(p.read_text()) for p in feature_dir(tmp_path, LAYER_IDS).glob("chunk_*.json"))
    assert chunks == [[0, 4, 2], [1], [3, 5]]
    assert cache_features(str(tmp_path), model, LAYER_IDS) == 0  # resumed: nothing left to do


def test_bf16_features_stay_close_to_the_fp32_forward():
    from dflash_trt.testing import make_tiny_target
    from dflash_trt.training.features import target_features

    model = make_tiny_target("llama")
    ids = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (9, 17)]
    for fp32, bf16 in zip(target_features(model, ids, LAYER_IDS), target_features(model, ids, LAYER_IDS, bf16=True)):
        assert bf16.shape == fp32.shape
        error = (bf16.float() - fp32).norm(dim=-1) / fp32.norm(dim=-1)
        assert 0 < error.max() < 0.03  # computed in bf16 (not equal), close to fp32
