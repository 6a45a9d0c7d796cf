"""`make bench-aiperf`: the AIPerf command line, the offline tokenizer cache, and the summary of a run.

AIPerf itself is not installed by `make setup` (it has its own venv); these tests check what the
benchmark hands to it and reads back.
"""

from __future__ import annotations

import json
from pathlib import Path

from dflash_trt.gateway.aiperf_bench import (TOKENIZER_REPO, AiperfConfig, aiperf_command, aiperf_requirement,
                                             format_table, level_summary, tokenizer_cache)


def test_the_aiperf_pin_comes_from_pyprojects_extra():
    requirement = aiperf_requirement()
    assert requirement.startswith("aiperf==") and requirement.count(".") >= 1


def test_the_engines_tokenizer_resolves_offline_as_a_cached_hub_repository(tiny_engine, tmp_path, monkeypatch):
    from huggingface_hub import snapshot_download
    from transformers import AutoTokenizer

    repo_id = tokenizer_cache(tiny_engine, tmp_path / "hf")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = snapshot_download(repo_id, local_files_only=True, cache_dir=str(tmp_path / "hf" / "hub"))
    tokenizer = AutoTokenizer.from_pretrained(snapshot)
    assert tokenizer.encode("Hello world") == AutoTokenizer.from_pretrained(str(tiny_engine / "target")).encode(
        "Hello world")


def test_aiperf_drives_the_chat_endpoint_greedily_with_server_token_counts(tmp_path):
    config = AiperfConfig(engine=Path("e"), request_count=8, input_tokens=64, output_tokens=32,
                          extra_args=("--benchmark-duration", "30"))
    command = aiperf_command(Path("aiperf"), config, "http://127.0.0.1:9000", "smollm2-135m", 4, tmp_path)
    assert command[:2] == ["aiperf", "profile"]
    pairs = dict(zip(command[2::1], command[3::1]))
    assert pairs["--endpoint-type"] == "chat" and pairs["--tokenizer"] == TOKENIZER_REPO
    assert pairs["--concurrency"] == "4" and pairs["--request-count"] == "8"
    assert pairs["--output-tokens-mean"] == "32" and json.loads(pairs["--extra-inputs"]) == {"temperature": 0, "ignore_eos": True}
    assert "--streaming" in command and "--use-server-token-count" in command
    assert command[-2:] == ["--benchmark-duration", "30"]


def test_a_run_summary_takes_aiperfs_figures_and_tau_from_the_counters(tmp_path):
    export = tmp_path / "profile_export_aiperf.json"
    export.write_text(json.dumps({
        "request_count": {"avg": 8.0}, "error_summary": [], "output_token_throughput": {"avg": 42.5},
        "request_throughput": {"avg": 1.25}, "time_to_first_token": {"p50": 80.0},
        "inter_token_latency": {"p50": 12.5}, "request_latency": {"p50": 900.0}}))
    before = {"dflash_spec_steps_total": 10.0, "dflash_accepted_draft_tokens_total": 5.0}
    after = {"dflash_spec_steps_total": 110.0, "dflash_accepted_draft_tokens_total": 255.0}
    summary = level_summary(export, before, after)
    assert summary == {"num_requests": 8, "num_errors": 0, "output_tokens_per_s": 42.5, "requests_per_s": 1.25,
                       "ttft_p50_ms": 80.0, "itl_p50_ms": 12.5, "latency_p50_ms": 900.0, "tau": 3.5}
    table = format_table({"dflash": {"4": summary}}).splitlines()
    assert table[-1] == "| dflash | 4 | 8 | 42.5 | 80 | 12.5 | 900 | 3.50 |"
    plain = {**summary, "output_tokens_per_s": 17.0, "tau": 1.0}
    table = format_table({"dflash": {"4": summary}, "plain": {"4": plain}}).splitlines()
    assert table[-3] == "| plain | 4 | 8 | 17.0 | 80 | 12.5 | 900 | 1.00 |"
    assert table[-1] == "output tokens/s, DFlash / plain, by concurrency: 4: 2.50x"


def test_aiperf_runs_in_its_own_process_group_and_is_stopped_with_it(tmp_path):
    """An interrupted benchmark must not leave AIPerf's services behind (they poll a core each)."""
    import sys
    import time

    import pytest

    from dflash_trt.errors import DFlashError
    from dflash_trt.gateway import aiperf_bench

    # A stand-in "aiperf" that starts a grandchild and then fails: both must be gone afterwards.
    script = tmp_path / "fake_aiperf.py"
    pid_file = tmp_path / "grandchild.pid"
    script.write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(0.5)\n"
        "sys.exit(3)\n")
    with pytest.raises(DFlashError, match="status 3"):
        aiperf_bench.run_aiperf([sys.executable, str(script)], {}, tmp_path / "aiperf.log", nice=5)
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 120  # generous: only reached when the grandchild was left running
    while time.monotonic() < deadline:
        try:
            os_kill(grandchild)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("AIPerf's child process outlived the benchmark")


def os_kill(pid: int) -> None:
    """Signal 0 to pid, reaping it first if it is a zombie of this process."""
    import os

    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    os.kill(pid, 0)


def test_heldout_prompts_become_an_interleaved_single_turn_dataset(tmp_path):
    from dflash_trt.gateway.aiperf_bench import heldout_dataset

    for family in ("code", "math"):
        (tmp_path / "prompts" / family).mkdir(parents=True)
        (tmp_path / "prompts" / family / "heldout.jsonl").write_text(
            "".join(json.dumps({"prompt": f"{family} {i}"}) + "\n" for i in range(2)))
    (tmp_path / "prompts" / "sharegpt-multiturn").mkdir()  # chat messages: not a single_turn prompt
    (tmp_path / "prompts" / "sharegpt-multiturn" / "heldout.jsonl").write_text(
        json.dumps({"prompt": [{"role": "user", "content": "hi"}]}) + "\n")
    path = heldout_dataset(tmp_path / "prompts", tmp_path / "out" / "heldout.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [{"text": "code 0"}, {"text": "math 0"}, {"text": "code 1"}, {"text": "math 1"}]
    command = aiperf_command(Path("aiperf"), AiperfConfig(engine=Path("e")), "http://h:1", "m", 1, tmp_path, path)
    pairs = dict(zip(command[2::1], command[3::1]))
    assert pairs["--input-file"] == str(path) and pairs["--custom-dataset-type"] == "single_turn"
    assert "--prompt-input-tokens-mean" not in command
