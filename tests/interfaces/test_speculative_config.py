"""vLLM's --speculative-config on `dflash-trt generate` and `dflash-trt engine`."""

from __future__ import annotations

import json

import pytest

from dflash_trt.cli import main
from dflash_trt.engine.speculative_config import parse_speculative_config
from dflash_trt.errors import ConfigError


def spec(drafter, **extra) -> str:
    return json.dumps({"method": "dflash", "model": str(drafter), **extra})


def test_block_size_is_num_speculative_tokens_plus_one(tiny_pair_dir):
    config = parse_speculative_config(spec(tiny_pair_dir / "drafter", num_speculative_tokens=3))
    assert (config.drafter, config.block_size, config.trained_block_size) == (tiny_pair_dir / "drafter", 4, 8)


def test_without_num_speculative_tokens_the_trained_block_size_is_used(tiny_pair_dir):
    assert parse_speculative_config(spec(tiny_pair_dir / "drafter")).block_size == 8


def test_method_is_case_insensitive_like_vllm(tiny_pair_dir):
    text = json.dumps({"method": "DFlash", "model": str(tiny_pair_dir / "drafter"), "num_speculative_tokens": 7})
    assert parse_speculative_config(text).block_size == 8


@pytest.mark.parametrize("text, message", [
    ('{"method": "eagle3", "model": "x"}', "method 'eagle3' is not supported"),
    ('{"model": "x"}', "'method' is missing"),
    ('{"method": "dflash", "model": "x",', "not valid JSON"),
    ('["dflash"]', "expected a JSON object"),
    ('{"method": "dflash", "model": "x", "draft_tensor_parallel_size": 2}',
     "unknown key(s) 'draft_tensor_parallel_size'"),
    ('{"method": "dflash"}', "'model' must name the DFlash drafter directory"),
    ('{"method": "dflash", "model": "no/such/drafter"}', "not a local drafter directory"),
])
def test_rejects_bad_configs_with_one_line(text, message):
    with pytest.raises(ConfigError) as error:
        parse_speculative_config(text)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("value", [0, -1, 2.5, "15", True])
def test_rejects_num_speculative_tokens_that_are_not_positive_integers(tiny_pair_dir, value):
    with pytest.raises(ConfigError, match="num_speculative_tokens must be a positive integer"):
        parse_speculative_config(spec(tiny_pair_dir / "drafter", num_speculative_tokens=value))


def test_rejects_a_block_beyond_the_trained_block_size(tiny_pair_dir):
    with pytest.raises(ConfigError, match="beyond the drafter's trained block_size 8"):
        parse_speculative_config(spec(tiny_pair_dir / "drafter", num_speculative_tokens=8))


def generate_json(capsys, tiny_pair_dir, *options) -> dict:
    code = main(["generate", "--target", str(tiny_pair_dir / "target"), "--prompt-ids", "5,6,7,8",
                 "--max-new-tokens", "12", "--stop-ids", "", "--json", *options])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def test_generate_with_speculative_config_equals_drafter_and_block_size(tiny_pair_dir, capsys):
    via_spec = generate_json(capsys, tiny_pair_dir, "--speculative-config",
                             spec(tiny_pair_dir / "drafter", num_speculative_tokens=3))
    via_flags = generate_json(capsys, tiny_pair_dir, "--drafter", str(tiny_pair_dir / "drafter"), "--block-size", "4")
    plain = generate_json(capsys, tiny_pair_dir)
    assert via_spec["block_size"] == 4
    # Every verify step drafts 3 tokens, but never more than the tokens left after it (the last steps).
    drafts = via_spec["draft_lengths"]
    assert len(drafts) == len(via_spec["acceptance_lengths"]) and max(drafts) == 3 and drafts[0] == 3
    assert via_spec["num_draft_tokens"] == sum(drafts)
    assert via_spec["token_ids"] == via_flags["token_ids"] == plain["token_ids"]


@pytest.mark.parametrize("config, message", [
    ('{"method": "ngram", "model": "x"}', "error: --speculative-config: method 'ngram' is not supported"),
    ("{method: dflash}", "error: --speculative-config: not valid JSON"),
])
def test_generate_reports_a_bad_config_as_one_error_line(tiny_pair_dir, capsys, config, message):
    code = main(["generate", "--target", str(tiny_pair_dir / "target"), "--prompt-ids", "5,6", "--max-new-tokens", "2",
                 "--speculative-config", config])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(message) and err.count("\n") == 1


def test_generate_refuses_speculative_config_together_with_drafter(tiny_pair_dir, capsys):
    code = main(["generate", "--target", str(tiny_pair_dir / "target"), "--prompt-ids", "5,6", "--max-new-tokens", "2",
                 "--drafter", str(tiny_pair_dir / "drafter"),
                 "--speculative-config", spec(tiny_pair_dir / "drafter")])
    assert code == 2
    assert "--speculative-config replaces --drafter" in capsys.readouterr().err


def test_engine_dry_run_takes_drafter_and_block_size_from_the_config(tiny_pair_dir, capsys, tmp_path):
    code = main(["engine", "--model", "smollm2-135m", "--target", str(tiny_pair_dir / "target"), "--dry-run",
                 "--out", str(tmp_path / "engine"),
                 "--speculative-config", spec(tiny_pair_dir / "drafter", num_speculative_tokens=5)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"drafter: dflash-trt/smollm2-135m-dflash -> {tiny_pair_dir / 'drafter'}" in out
    assert "block 6" in out


def test_engine_rejects_a_block_beyond_the_trained_one(tiny_pair_dir, capsys):
    code = main(["engine", "--model", "smollm2-135m", "--target", str(tiny_pair_dir / "target"), "--dry-run",
                 "--speculative-config", spec(tiny_pair_dir / "drafter", num_speculative_tokens=15)])
    assert code == 2
    assert "block size 16, beyond the drafter's trained block_size 8" in capsys.readouterr().err


def _dflash2_dir(tmp_path, name="drafter"):
    from dflash_trt.testing import make_tiny_drafter, make_tiny_target

    directory = tmp_path / name
    make_tiny_drafter(make_tiny_target("llama").config, directory, family="dflash2", block_size=8)
    return directory


def test_dflash2_drafters_run_under_method_dflash_like_vllm(tmp_path):
    config = parse_speculative_config(spec(_dflash2_dir(tmp_path), num_speculative_tokens=7))
    assert (config.family, config.block_size) == ("dflash2", 8)


def test_method_may_be_omitted_when_the_model_path_says_dflash_like_vllm(tmp_path):
    directory = _dflash2_dir(tmp_path, "my-DFlash2-drafter")
    assert parse_speculative_config(json.dumps({"model": str(directory)})).family == "dflash2"


def test_method_dflash2_is_refused_with_the_vllm_spelling(tmp_path):
    with pytest.raises(ConfigError, match='DFlash2 drafters run under method "dflash", as in vLLM'):
        parse_speculative_config(json.dumps({"method": "dflash2", "model": str(_dflash2_dir(tmp_path))}))
