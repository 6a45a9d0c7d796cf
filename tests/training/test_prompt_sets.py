"""Prompt sets: deterministic, disjoint train / held-out splits, and the committed files match the generator."""

import json
from pathlib import Path

from dflash_trt.data.prompts import FAMILIES, PromptSetConfig, build_prompt_sets, load_prompts, write_prompt_sets

REPO_PROMPTS = Path(__file__).resolve().parents[2] / "data" / "prompts"
SMALL = PromptSetConfig(train_per_family=200, heldout_per_family=10)


def test_heldout_and_train_prompts_are_disjoint_in_the_repository():
    train = {json.dumps(p) for _, p in load_prompts(REPO_PROMPTS, "train")}
    heldout = {json.dumps(p) for _, p in load_prompts(REPO_PROMPTS, "heldout")}
    assert len(train) > 3000 and len(heldout) >= 4 * 32
    assert not train & heldout


def test_every_family_has_heldout_prompts():
    from dflash_trt.data.sources import SOURCE_FAMILIES

    families = {f for f, _ in load_prompts(REPO_PROMPTS, "heldout")}
    assert families == set(FAMILIES) | set(SOURCE_FAMILIES)


def test_generation_is_deterministic_and_disjoint():
    first, second = build_prompt_sets(SMALL), build_prompt_sets(SMALL)
    assert first == second
    for splits in first.values():
        assert not set(splits["train"]) & set(splits["heldout"])
        assert len(splits["heldout"]) == 10


def test_committed_files_are_what_the_generator_writes(tmp_path):
    write_prompt_sets(tmp_path)
    for family in FAMILIES:
        for split in ("train", "heldout"):
            assert (tmp_path / family / f"{split}.jsonl").read_text() == \
                (REPO_PROMPTS / family / f"{split}.jsonl").read_text(), (family, split)


def test_plain_text_prompt_files_are_accepted(tmp_path):
    (tmp_path / "misc").mkdir()
    (tmp_path / "misc" / "heldout.txt").write_text("first prompt\n\nsecond prompt\n")
    assert load_prompts(tmp_path, "heldout") == [("misc", "first prompt"), ("misc", "second prompt")]
    line = (REPO_PROMPTS / "math" / "heldout.jsonl").read_text().splitlines()[0]
    assert set(json.loads(line)) == {"prompt", "family"}
