"""The load-time canary (canary.py): measured on a pair whose drafter is perfect and on a deliberately
useless one, in process and on the real tritonserver.

The pair is built so that the outcome is known: the target's final norm is zero, so its logits are all
equal and greedy decoding always picks token 0. A drafter with a zero final norm does the same (every draft
accepted); a random drafter almost never guesses token 0 (acceptance near zero)."""

from __future__ import annotations

import re
import shutil
import urllib.request
from pathlib import Path

import pytest
import torch

from dflash_trt.serving import canary
from dflash_trt.serving.metrics import DFlashMetrics
from dflash_trt.serving.runtime import LocalRuntime

BLOCK_SIZE = 8


@pytest.fixture(scope="session")
def canary_pair(tmp_path_factory, smollm2_tokenizer_dir) -> Path:
    from dflash_trt.decoding.model.drafters import save_drafter
    from dflash_trt.testing import make_tiny_drafter, make_tiny_target

    root = tmp_path_factory.mktemp("canary-pair")
    target = make_tiny_target("llama", vocab_size=49152, hidden_size=32, num_layers=6)
    with torch.no_grad():
        target.model.norm.weight.zero_()  # all logits equal: greedy always emits token 0
    target.save_pretrained(str(root / "target"))
    for item in smollm2_tokenizer_dir.iterdir():
        shutil.copy(item, root / "target" / item.name)
    good = make_tiny_drafter(target.config, block_size=BLOCK_SIZE)
    with torch.no_grad():
        good.norm.weight.zero_()  # drafts token 0 too: a perfect drafter for this target
    save_drafter(good, root / "good")
    make_tiny_drafter(target.config, root / "useless", seed=1, block_size=BLOCK_SIZE)
    return root


def runtime_for(pair: Path, drafter: str | None, block_size: int = BLOCK_SIZE) -> LocalRuntime:
    from dflash_trt.decoding.model.drafters import load_drafter
    from dflash_trt.decoding.model.target import load_target

    return LocalRuntime(load_target(pair / "target"), load_drafter(pair / drafter) if drafter else None, block_size)


def test_a_matched_drafter_reads_as_healthy(canary_pair):
    result = canary.run_canary(runtime_for(canary_pair, "good"), 24)
    # Every draft accepted; tau is the tokens per verify step, the last block shrunk to the 7 tokens left.
    assert result.num_prompts == len(canary.CANARY_PROMPTS) and result.num_output_tokens == 24 * result.num_prompts
    assert result.acceptance_rate == 1.0 and result.tau == (24 - 1) / 3 and not result.is_near_zero
    level, message = canary.describe(result)
    assert level == "info" and "accepted (100.0%)" in message and "NEAR ZERO" not in message
    assert "tau 7.67 (tokens per verify step" in message


def test_a_low_rate_with_a_real_gain_is_not_near_zero():
    # The shipped demo pair at block 8: about one of seven drafts accepted per step. The rate (14 %) reads
    # as broken, tau 2 is a real gain: the canary must not cry wolf (it did, judging by the rate).
    healthy = canary.CanaryResult(block_size=8, num_spec_steps=20, num_draft_tokens=140, num_accepted_tokens=20,
                                  num_output_tokens=40, acceptance_rate=20 / 140, tau=2.0)
    assert not healthy.is_near_zero and canary.describe(healthy)[0] == "info"
    collapsed = canary.CanaryResult(block_size=8, num_spec_steps=30, num_draft_tokens=210, num_accepted_tokens=2,
                                    num_output_tokens=32, acceptance_rate=2 / 210, tau=32 / 30)
    assert collapsed.is_near_zero and canary.describe(collapsed)[0] == "warn"


def test_a_useless_drafter_is_reported_plainly(canary_pair):
    result = canary.run_canary(runtime_for(canary_pair, "useless"), 24)
    assert result.is_near_zero and result.num_spec_steps >= 3 and result.num_output_tokens == 24 * 3
    level, message = canary.describe(result)
    assert level == "warn" and "ACCEPTANCE NEAR ZERO" in message and "no speedup" in message


def test_plain_decoding_has_nothing_to_measure(canary_pair):
    result = canary.run_canary(runtime_for(canary_pair, None, block_size=1), 8)
    assert not result.is_near_zero and canary.describe(result)[1].startswith("dflash canary: no drafts")


def test_the_prompts_go_through_the_engines_chat_template(smollm2_tokenizer):
    for prompt in canary.CANARY_PROMPTS:
        text = smollm2_tokenizer.decode(canary.canary_prompt_ids(smollm2_tokenizer, prompt))
        assert "<|im_start|>user" in text and prompt in text and text.rstrip().endswith("assistant")


def test_the_prompts_are_real_held_out_prompts():
    from dflash_trt.data.prompts import load_prompts

    root = Path(__file__).resolve().parents[2] / "data" / "prompts"
    held_out = {prompt for _family, prompt in load_prompts(root, "heldout", ("chat", "code", "math"))}
    assert set(canary.CANARY_PROMPTS) <= held_out


def test_check_at_load_logs_and_exports(canary_pair, fake_pb):
    metrics = DFlashMetrics(fake_pb, "dflash")
    greedy, sampled = canary.check_at_load(runtime_for(canary_pair, "useless"), 16, metrics, fake_pb.Logger)
    assert (greedy.temperature, sampled.temperature) == (0.0, canary.CANARY_TEMPERATURE)
    assert metrics.canary_gauges["dflash_canary_acceptance_rate"].value == greedy.acceptance_rate < 0.05
    assert metrics.canary_gauges["dflash_canary_acceptance_length"].value == greedy.tau
    assert metrics.canary_gauges["dflash_canary_sampled_acceptance_rate"].value == sampled.acceptance_rate < 0.05
    assert metrics.canary_gauges["dflash_canary_sampled_acceptance_length"].value == sampled.tau
    first, second = fake_pb.Logger.lines
    assert first[0] == "warn" and "ACCEPTANCE NEAR ZERO at load: greedy:" in first[1]
    assert second[0] == "warn" and "sampled at temperature 1:" in second[1]


def test_the_sampled_canary_really_samples(canary_pair):
    # The good drafter always drafts token 0, which greedy decoding of this target always picks. Sampled at
    # T > 0, the target's distribution is uniform over 49152 tokens: a one-hot draft is accepted only when
    # the sample equals it, so acceptance collapses. A canary that ran greedy at T > 0 would read 100 % here.
    runtime = runtime_for(canary_pair, "good")
    greedy = canary.run_canary(runtime, 24)
    sampled = canary.run_canary(runtime, 24, temperature=canary.CANARY_TEMPERATURE)
    assert greedy.acceptance_rate == 1.0 and sampled.is_near_zero and sampled.num_output_tokens == 24 * 3
    level, message = canary.describe(sampled)
    assert level == "warn" and "use_rejection_sampling: true" in message
    again = canary.run_canary(runtime, 24, temperature=canary.CANARY_TEMPERATURE)
    assert (again.num_accepted_tokens, again.num_spec_steps) == (sampled.num_accepted_tokens, sampled.num_spec_steps)


def test_canary_tokens_zero_turns_it_off(fake_pb):
    metrics = DFlashMetrics(fake_pb, "dflash")
    assert canary.check_at_load(object(), 0, metrics, fake_pb.Logger) == []
    assert fake_pb.Logger.lines == [("info", "dflash canary: off (canary_tokens 0)")]
    assert metrics.canary_gauges == {}  # nothing exported, so no alert on a canary that never ran
    assert metrics.families["dflash_canary_acceptance_rate"].metrics == []


def test_a_model_that_cannot_generate_fails_its_load(fake_pb, smollm2_tokenizer):
    class Broken:
        tokenizer, block_size = smollm2_tokenizer, BLOCK_SIZE

        def steps(self, prompt_ids, request, end_ids):
            raise RuntimeError("CUDA error: out of memory")

    with pytest.raises(RuntimeError, match=r"canary: the load-time generation \(temperature 0\) failed: CUDA error"):
        canary.check_at_load(Broken(), 8, DFlashMetrics(fake_pb, "dflash"), fake_pb.Logger)


@pytest.mark.slow
def test_tritonserver_log_and_metrics_show_a_useless_drafter(canary_pair, tmp_path):
    from dflash_trt.engine.build import BuildRequest, build_engine
    from dflash_trt.serving.repo import RepoConfig, render_repository
    from dflash_trt.serving.server import serve_on_free_ports

    engine = tmp_path / "engine"
    build_engine(BuildRequest(model="smollm2-135m", target=canary_pair / "target", drafter=canary_pair / "useless",
                              out=engine), log=lambda _line: None)
    repo = render_repository(RepoConfig(engine, tmp_path / "repo", num_threads=1, canary_tokens=24))
    with serve_on_free_ports(repo, ready_timeout_s=600) as server:
        with urllib.request.urlopen(server.config.metrics_url, timeout=10) as response:
            page = response.read().decode()
        log = server.log
    assert "dflash canary: ACCEPTANCE NEAR ZERO at load" in log, log[-3000:]
    rate = float(re.search(r'^dflash_canary_acceptance_rate\{model="dflash"\} (\S+)$', page, re.M).group(1))
    tau = float(re.search(r'^dflash_canary_acceptance_length\{model="dflash"\} (\S+)$', page, re.M).group(1))
    assert rate < 0.05 and 1.0 <= tau < 1.0 + canary.NEAR_ZERO_ACCEPTED_PER_STEP
    sampled = float(re.search(r'^dflash_canary_sampled_acceptance_rate\{model="dflash"\} (\S+)$', page, re.M).group(1))
    assert sampled < 0.05 and "sampled at temperature 1:" in log


def test_a_target_without_a_tokenizer_still_gets_its_canary(tmp_path):
    # Such a target takes token ids only (no invented vocabulary): the canary runs on fixed ids, not text.
    from dflash_trt.decoding.model.drafters import save_drafter
    from dflash_trt.decoding.model.target import load_target
    from dflash_trt.testing import make_tiny_drafter, make_tiny_target

    model = make_tiny_target("qwen3")
    model.save_pretrained(tmp_path / "target")
    save_drafter(make_tiny_drafter(model.config), tmp_path / "drafter")
    runtime = runtime_for(tmp_path, "drafter")
    assert load_target(tmp_path / "target").tokenizer is None
    result = canary.run_canary(runtime, 12)
    assert result.num_output_tokens == 12 and result.num_spec_steps >= 1
