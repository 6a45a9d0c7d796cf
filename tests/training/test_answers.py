"""Answer files: generated answers are the target's greedy answers alone; importing committed answers; resuming
whatever shard wrote them."""

import json
from pathlib import Path

import pytest
import torch

from dflash_trt.errors import DFlashError
from dflash_trt.training.answers import (AnswerConfig, answered_indices, chat_ids, generate_answers, import_answers,
                                         ordered_prompts, read_answers)

REPO = Path(__file__).resolve().parents[2]


def _prompt_sets(root):
    for family in ("math", "code"):
        (root / family).mkdir(parents=True)
        (root / family / "train.txt").write_text("\n".join(f"{family} prompt {i}" for i in range(4)))
    return str(root)


def _answer_file(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _record(idx, prompt):
    return {"idx": idx, "family": prompt.split()[0], "prompt": prompt, "ids": [1, 2, 3, idx], "prompt_len": 3}


def test_import_takes_only_answers_to_the_same_prompt_at_the_same_index(tmp_path):
    prompts = _prompt_sets(tmp_path / "prompts")
    order = [p for _, p in ordered_prompts(prompts, 8, 0)]
    source = tmp_path / "committed"
    _answer_file(source / "answers.0-of-2.jsonl", [_record(0, order[0]), _record(2, order[2])])
    _answer_file(source / "answers.1-of-2.jsonl", [_record(1, order[3]),  # another prompt at index 1
                                                   _record(7, order[7])])
    data = tmp_path / "data"

    assert import_answers(source, data, prompts, max_prompts=6) == 2  # index 7 is past max_prompts
    assert answered_indices(data) == {0, 2}
    assert [r["prompt"] for r in read_answers(data)] == [order[0], order[2]]
    # Importing again adds nothing: the data directory already holds those indices.
    assert import_answers(source, data, prompts, max_prompts=8) == 1
    assert answered_indices(data) == {0, 2, 7}


def test_import_from_a_pattern_of_chunk_files_and_a_per_family_cap(tmp_path):
    """A later round imports only the chunks written after the last one (a glob pattern) and a capped
    replay of a family: the first N of its prompts, and a second import stays within the cap."""
    prompts = _prompt_sets(tmp_path / "prompts")
    order = [p for _, p in ordered_prompts(prompts, 8, 0)]
    source = tmp_path / "committed"
    _answer_file(source / "answers.0-of-1.0000.jsonl", [_record(i, order[i]) for i in range(0, 4)])
    _answer_file(source / "answers.0-of-1.0001.jsonl", [_record(i, order[i]) for i in range(4, 8)])
    data = tmp_path / "data"
    assert import_answers(source / "answers.0-of-1.0001.jsonl", data, prompts, max_prompts=8) == 4
    assert answered_indices(data) == set(range(4, 8))
    family = order[0].split()[0]
    family_of = [order[i].split()[0] for i in range(8)]
    cap = family_of[4:].count(family) + 1  # room for one more answer of it
    copied = import_answers(str(source / "answers.*.jsonl"), data, prompts, max_prompts=8, per_family={family: cap})
    assert copied == 1 + sum(f != family for f in family_of[:4])  # every other family's answer, one of `family`
    held = read_answers(data)
    assert sum(r["family"] == family for r in held) == cap
    assert 0 in {r["idx"] for r in held}  # the lowest index of the family is the one taken
    assert import_answers(source, data, prompts, max_prompts=8, per_family={family: cap}) == 0
    with pytest.raises(DFlashError, match="neither a directory nor a pattern"):
        import_answers(str(source / "answers.9-*.jsonl"), data, prompts, max_prompts=8)


def test_a_fully_answered_directory_needs_no_target(tmp_path):
    """Answers written by two shards (or imported) count for a single-shard run: nothing is regenerated."""
    prompts = _prompt_sets(tmp_path / "prompts")
    order = [p for _, p in ordered_prompts(prompts, 8, 0)]
    data = tmp_path / "data"
    _answer_file(data / "answers.0-of-2.jsonl", [_record(i, order[i]) for i in range(0, 8, 2)])
    _answer_file(data / "answers.1-of-2.jsonl", [_record(i, order[i]) for i in range(1, 8, 2)])
    # A target that does not exist: loading it would fail, so this passes only if generation is skipped.
    cfg = AnswerConfig(prompts=prompts, out=str(data), target=str(tmp_path / "no-such-model"), max_prompts=8)
    generate_answers(cfg)
    assert [r["idx"] for r in read_answers(data)] == list(range(8))
    assert not (data / "answers.0-of-1.jsonl").exists()


def test_train_drafter_imports_the_presets_committed_answers_unless_told_otherwise(monkeypatch):
    import dflash_trt.training.pipeline as pipeline
    from dflash_trt.cli import main

    seen = []
    monkeypatch.setattr(pipeline, "run_pipeline", lambda cfg: seen.append(cfg) or {})
    main(["train-drafter", "--stages", "answers"])
    main(["train-drafter", "--stages", "answers", "--answers-from", ""])
    main(["train-drafter", "--stages", "answers", "--target", "my-model"])
    main(["train-drafter", "--stages", "answers", "--target", "my-model", "--answers-from", "mine"])
    committed = pipeline.PRESETS["smollm2-135m"]["answers"]
    assert [c.answers_from for c in seen] == [committed, None, None, "mine"]
    main(["train-drafter", "--stages", "answers", "--import-per-family", "math=250, chat=250"])
    assert seen[-1].import_per_family == {"math": 250, "chat": 250} and seen[0].import_per_family == {}
    # Every training prompt is in the preset's prompt count, and the template prompts are all answered.
    assert seen[0].max_prompts == len(ordered_prompts(str(REPO / "data" / "prompts"), 10**6, 0))
    templates = read_answers(REPO / committed.split(",")[0])
    assert [r["idx"] for r in templates] == list(range(5804))


def test_generated_answers_are_the_targets_greedy_answers_alone(tmp_path, tiny_text_pair_dir):
    """Answers decoded together in the in-flight batch (3 at a time, 8 prompts, so rows leave and join) are
    each the target's greedy answer generated alone, and land in chunk files of the asked size."""
    from dflash_trt.training.target_io import load_hf_target

    prompts, data, target = _prompt_sets(tmp_path / "prompts"), tmp_path / "data", tiny_text_pair_dir / "target"
    generate_answers(AnswerConfig(prompts=prompts, out=str(data), target=str(target), max_prompts=8,
                                  max_new_tokens=10, batch_size=3, chunk_records=3))

    records = read_answers(data)
    assert [r["idx"] for r in records] == list(range(8))
    assert [len(p.read_text().splitlines()) for p in sorted(data.glob("answers.0-of-1.*.jsonl"))] == [3, 3, 2]
    model, tok = load_hf_target(str(target))
    order = [p for _, p in ordered_prompts(prompts, 8, 0)]
    for record in records:
        prompt_ids = record["ids"][:record["prompt_len"]]
        assert record["prompt"] == order[record["idx"]] and prompt_ids == chat_ids(tok, record["prompt"])
        alone = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                               max_new_tokens=10, do_sample=False, pad_token_id=0)
        assert record["ids"][record["prompt_len"]:] == alone[0, len(prompt_ids):].tolist()
