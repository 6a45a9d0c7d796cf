"""Feature cache: polling reads only chunks with new samples."""

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
