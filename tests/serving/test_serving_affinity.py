"""Two real tritonservers, each with its own prefix cache: a conversation kept on one replica (session affinity)
reuses its history; benchmarks/affinity.py measures the hit rate with and without affinity."""

from contextlib import ExitStack

import pytest

from dflash_trt.benchmarks.affinity import replay_served, summarize
from dflash_trt.benchmarks.multi_turn import Conversation

CONVERSATIONS = [
    Conversation(["Name three rivers in Europe and say one thing about each.", "Which one is the longest?",
                  "How long is it in kilometres?"]),
    Conversation(["Write two sentences about the moon landing.", "Who was the second person on the moon?",
                  "What did he do afterwards?"]),
]


@pytest.mark.slow
def test_turns_kept_on_one_replica_reuse_their_history(tiny_engine, smollm2_tokenizer_dir, tmp_path):
    from transformers import AutoTokenizer

    from dflash_trt.serving.repo import RepoConfig, render_repository
    from dflash_trt.serving.server import serve_on_free_ports

    # One dflash instance per server: Triton would spread one server's requests over its instances' caches too.
    repo = render_repository(RepoConfig(tiny_engine, tmp_path / "repo", num_threads=1, block_policy="fixed"))
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))
    with ExitStack() as stack:
        servers = [stack.enter_context(serve_on_free_ports(repo, ready_timeout_s=600, log_path=tmp_path / f"s{i}.log"))
                   for i in range(2)]
        records = replay_served([s.config.grpc_url for s in servers], tokenizer, CONVERSATIONS, "affinity",
                                concurrency=2, max_tokens=8)
    assert len(records) == 6
    for index in range(2):
        mine = sorted((r for r in records if r["conversation"] == index), key=lambda r: r["turn"])
        assert {r["replica"] for r in mine} == {index}  # affinity: one replica per conversation
        for previous, later in zip(mine, mine[1:]):
            # The later prompt starts with the earlier one: its whole 16-token blocks come from the cache.
            assert later["cached_tokens"] >= previous["context_tokens"] // 16 * 16 - 16, (previous, later)
            assert later["cached_tokens"] < later["context_tokens"]
    assert summarize(records)["hit_rate_later_turns"] > 0.5
