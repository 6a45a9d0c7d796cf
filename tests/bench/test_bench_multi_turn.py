"""The multi-turn scenario (benchmarks/multi_turn.py): conversations replayed turn by turn with the model's own
answers, without and with the prefix cache; both runs agree token for token and step for step, later turns hit
the cache, and the cache stays within its budget."""

from __future__ import annotations

import json

import pytest

from dflash_trt.benchmarks.multi_turn import (Conversation, ReplayRun, TurnRecord, compare, format_multi_turn,
                                              load_conversations, replay, run_multi_turn)
from dflash_trt.decoding.model.tokens import default_stop_ids, encode_prompt
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.errors import DFlashError

CONVERSATIONS = [Conversation(["Name a colour and say why you like it.", "And another one?", "Which is warmer?"]),
                 Conversation(["Write a haiku about the sea.", "Now one about rain."]),
                 Conversation(["What is 2 + 3? Explain step by step.", "And 4 + 5?"])]
MAX_NEW = 12


@pytest.fixture(scope="module")
def engine(bench_engine):
    from dflash_trt.engine import load_engine

    return load_engine(bench_engine)


@pytest.fixture(scope="module")
def params(engine):
    return SamplingParams(max_new_tokens=MAX_NEW, stop_token_ids=tuple(default_stop_ids(engine.target)))


@pytest.fixture(scope="module")
def runs(engine, params):
    """Concurrency 1 and 2, each without and with a cache."""
    return {(level, budget): replay(engine.target, engine.drafter, CONVERSATIONS, params, engine.block_size, level,
                                    budget)
            for level in (1, 2) for budget in (0, 64 * 2**20)}


def test_every_turn_of_every_conversation_is_served_in_order(runs):
    for run in runs.values():
        assert [(t.conversation, t.turn) for t in run.turns] == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (2, 1),
                                                                 (2, 2)]
        assert all(t.token_ids and t.ttft_s > 0 for t in run.turns)


def test_cached_and_uncached_runs_agree_token_for_token_and_step_for_step(runs):
    for level in (1, 2):
        differences = compare(runs[level, 0], runs[level, 64 * 2**20])
        assert differences["output_differences"] == 0 and differences["acceptance_differences"] == 0
    # The batch a turn shares its steps with changes nothing either.
    assert [t.token_ids for t in runs[1, 0].turns] == [t.token_ids for t in runs[2, 64 * 2**20].turns]


def test_a_later_turn_resends_the_history_with_the_models_own_answer(engine, runs):
    run = runs[1, 0]
    first, second = run.turns[0], run.turns[1]
    answer = engine.target.tokenizer.decode(first.token_ids, skip_special_tokens=True)
    history = [{"role": "user", "content": CONVERSATIONS[0].user_turns[0]}, {"role": "assistant", "content": answer},
               {"role": "user", "content": CONVERSATIONS[0].user_turns[1]}]
    assert second.prompt_tokens == len(encode_prompt(engine.target, history, chat=True))
    assert second.prompt_tokens > first.prompt_tokens + len(first.token_ids) // 2


def test_later_turns_hit_the_cache_and_no_turn_hits_without_one(runs):
    uncached, cached = runs[1, 0], runs[1, 64 * 2**20]
    assert all(t.cached_tokens == 0 for t in uncached.turns) and uncached.summary()["hit_rate"] == 0.0
    block = 16  # PrefixCache's default block_tokens
    for previous, turn in zip(cached.turns, cached.turns[1:]):
        if turn.turn >= 2:  # the earlier turn's prompt is cached, all but a partial last block
            assert turn.cached_tokens >= (previous.prompt_tokens // block - 1) * block > 0
            assert turn.cached_tokens < turn.prompt_tokens  # the last prompt token is always computed
    summary = cached.summary()
    assert 0 < summary["hit_rate"] < summary["hit_rate_later_turns"] < 1
    assert 0 < summary["peak_cache_kv_bytes"] <= summary["cache_bytes_budget"] and summary["within_budget"]
    assert summary["peak_cache_bytes"] > summary["peak_cache_kv_bytes"]  # the drafter's features come on top


def test_a_small_budget_evicts_and_keeps_memory_within_it(engine, params, runs):
    budget = runs[1, 64 * 2**20].summary()["peak_cache_kv_bytes"] // 4
    small = replay(engine.target, engine.drafter, CONVERSATIONS, params, engine.block_size, 1, budget)
    assert 0 < small.peak_cache_kv_bytes <= budget
    assert compare(runs[1, 0], small)["output_differences"] == 0


def test_compare_counts_a_changed_turn():
    """The check that guards the cache's exactness: one token or one acceptance length off is counted."""
    def run(tokens, accepted):
        return ReplayRun(1, 0, [TurnRecord(0, 1, 40, 0, 0.1, [5, 6], [2], 2.0),
                                TurnRecord(0, 2, 60, 32, 0.05, tokens, accepted, 1.0)], wall_s=1.0)

    assert compare(run([7, 8], [1, 1]), run([7, 8], [1, 1]))["output_differences"] == 0
    assert compare(run([7, 8], [1, 1]), run([7, 9], [1, 1]))["output_differences"] == 1
    assert compare(run([7, 8], [1, 1]), run([7, 8], [2]))["acceptance_differences"] == 1
    assert compare(run([7, 8], [1, 1]), run([7, 8], [1, 1]))["ttft_p50_speedup_later_turns"] == pytest.approx(1.0)


def test_the_report_has_both_runs_per_level_and_the_checks(engine, params):
    summary = run_multi_turn(engine.target, engine.drafter, CONVERSATIONS[:2], params, engine.block_size, (1, 2),
                             32 * 2**20, log=lambda _line: None)
    assert set(summary["levels"]) == {"1", "2"}
    for level in summary["levels"].values():
        assert level["output_differences"] == 0 and level["acceptance_differences"] == 0
        assert level["cache"]["tau"] == level["no_cache"]["tau"] > 0
        assert level["cache"]["hit_rate"] > 0 == level["no_cache"]["hit_rate"]
    lines = format_multi_turn(summary)
    assert "TTFT turns 2+ p50/p99" in lines[1] and len(lines) == 2 + 3 * 2
    assert all("output differences 0, acceptance differences 0, within budget: yes" in line for line in lines[4::3])


def test_conversations_load_as_user_turns_and_bad_settings_are_refused(tmp_path, engine, params):
    family = tmp_path / "sharegpt-multiturn"
    family.mkdir()
    record = {"prompt": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                         {"role": "user", "content": "Bye"}]}
    (family / "heldout.jsonl").write_text("\n".join(json.dumps(record) for _ in range(3)) + "\n")
    conversations = load_conversations(tmp_path, 2)
    assert [c.user_turns for c in conversations] == [["Hi", "Bye"], ["Hi", "Bye"]]
    with pytest.raises(DFlashError, match="no multi-turn conversations .*--no-multi-turn"):
        load_conversations(tmp_path / "missing", 2)
    with pytest.raises(DFlashError, match="prefix_cache_bytes must be >= 1"):
        run_multi_turn(engine.target, engine.drafter, conversations, params, engine.block_size, (1,), 0)
    with pytest.raises(DFlashError, match="concurrency and replicas must be >= 1"):
        replay(engine.target, engine.drafter, conversations, params, engine.block_size, 0, 0)


def test_affinity_keeps_each_later_turn_on_the_replica_with_its_history(engine, params, runs):
    budget = 64 * 2**20
    one = runs[1, budget]
    affinity = replay(engine.target, engine.drafter, CONVERSATIONS, params, engine.block_size, 1, budget,
                      replicas=2, routing="affinity")
    spread = replay(engine.target, engine.drafter, CONVERSATIONS, params, engine.block_size, 1, budget,
                    replicas=2, routing="random")
    later = [(a, b) for a, b in zip(one.turns, affinity.turns) if a.turn >= 2]
    assert all(a.cached_tokens == b.cached_tokens > 0 for a, b in later)  # as with one replica
    assert spread.summary()["hit_rate_later_turns"] <= affinity.summary()["hit_rate_later_turns"]
    assert compare(one, affinity)["output_differences"] == compare(one, spread)["output_differences"] == 0
    with pytest.raises(DFlashError, match="routing must be one of affinity, random"):
        replay(engine.target, engine.drafter, CONVERSATIONS, params, engine.block_size, 1, budget, routing="hash")
