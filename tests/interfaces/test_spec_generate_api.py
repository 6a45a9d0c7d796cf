"""The reference project's Python snippet runs unchanged (local paths) and decodes like the target alone."""

from __future__ import annotations

import pytest
import torch

MAX_NEW_TOKENS = 48


def run_reference_snippet(drafter_dir: str, target_dir: str, max_new_tokens: int = MAX_NEW_TOKENS):
    """The reference README's Transformers snippet, with local directories and the CPU."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflash_trt import DFlashDrafter

    draft = DFlashDrafter.from_pretrained(drafter_dir, trust_remote_code=True, dtype="auto", device_map="cpu").eval()
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype="auto", device_map="cpu").eval()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)

    messages = [{"role": "user", "content": "How many positive whole-number divisors does 196 have?"}]
    input_ids = tokenizer.apply_chat_template(messages, return_tensors="pt", add_generation_prompt=True,
                                              enable_thinking=False).to(draft.device)

    output = draft.spec_generate(input_ids=input_ids, max_new_tokens=max_new_tokens, temperature=0.0,
                                 target=target, stop_token_ids=[tokenizer.eos_token_id])
    print(tokenizer.decode(output[0], skip_special_tokens=False))
    return output, input_ids, target, draft, tokenizer


@pytest.fixture(scope="module")
def snippet(tiny_text_pair_dir):
    return run_reference_snippet(str(tiny_text_pair_dir / "drafter"), str(tiny_text_pair_dir / "target"))


def prompt_tensor(input_ids) -> torch.Tensor:
    return input_ids["input_ids"] if hasattr(input_ids, "keys") else input_ids


def test_reference_snippet_equals_target_only_greedy_decoding(snippet):
    output, input_ids, target, _, tokenizer = snippet
    prompt = prompt_tensor(input_ids)
    expected = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=MAX_NEW_TOKENS,
                               do_sample=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=0)
    assert output.dtype == torch.long
    assert prompt.shape[1] < output.shape[1] <= prompt.shape[1] + MAX_NEW_TOKENS
    assert torch.equal(output, expected)


def test_a_tree_budget_gives_the_same_tokens_and_a_bad_one_is_refused(snippet):
    from dflash_trt import DFlashError

    output, input_ids, target, draft, _ = snippet
    prompt = prompt_tensor(input_ids)
    for budget, top_k in ((16, None), (5, 2)):
        tree = draft.spec_generate(input_ids=prompt, max_new_tokens=MAX_NEW_TOKENS, temperature=0.0, target=target,
                                   stop_token_ids=None, tree_budget=budget, tree_top_k=top_k)
        assert torch.equal(tree[:, :output.shape[1]], output)
    with pytest.raises(DFlashError, match=r"tree budget must be >= 0 \(0 means the chain\), got -2"):
        draft.spec_generate(input_ids=prompt, max_new_tokens=4, target=target, tree_budget=-2)


def test_output_ends_at_the_first_stop_token_which_is_kept(snippet):
    output, input_ids, target, draft, _ = snippet
    prompt = prompt_tensor(input_ids)
    new = output[0, prompt.shape[1]:].tolist()
    stop = new[5]
    first = new.index(stop)
    stopped = draft.spec_generate(input_ids=prompt, max_new_tokens=MAX_NEW_TOKENS, temperature=0.0, target=target,
                                  stop_token_ids=[stop, None])
    assert stopped[0, prompt.shape[1]:].tolist() == new[:first + 1]


def test_sampling_returns_prompt_plus_new_tokens(snippet):
    _, input_ids, target, draft, _ = snippet
    prompt = prompt_tensor(input_ids)
    torch.manual_seed(0)
    output = draft.spec_generate(input_ids=prompt, max_new_tokens=8, temperature=0.7, target=target,
                                 stop_token_ids=None)
    assert output.shape == (1, prompt.shape[1] + 8)
    assert torch.equal(output[:, :prompt.shape[1]], prompt)


def test_rejects_a_batch_of_prompts(snippet):
    from dflash_trt import DFlashError

    _, input_ids, target, draft, _ = snippet
    prompt = prompt_tensor(input_ids)
    with pytest.raises(DFlashError, match=r"shape \[1, L\]"):
        draft.spec_generate(input_ids=prompt.repeat(2, 1), max_new_tokens=4, temperature=0.0, target=target,
                            stop_token_ids=None)


def test_rejects_a_drafter_in_another_dtype_than_the_target(snippet, tiny_text_pair_dir):
    from dflash_trt import DFlashDrafter, DFlashError

    _, input_ids, target, _, _ = snippet
    draft = DFlashDrafter.from_pretrained(str(tiny_text_pair_dir / "drafter"), dtype="bfloat16")
    assert next(draft.parameters()).dtype == torch.bfloat16
    with pytest.raises(DFlashError, match="same dtype"):
        draft.spec_generate(input_ids=prompt_tensor(input_ids), max_new_tokens=4, temperature=0.0, target=target)


def test_from_pretrained_names_a_missing_local_directory(tmp_path):
    from dflash_trt import DFlashDrafter
    from dflash_trt.errors import ConfigError

    with pytest.raises(ConfigError, match="not a local drafter directory"):
        DFlashDrafter.from_pretrained(str(tmp_path / "z-lab" / "Qwen3-8B-DFlash-b16"))


def test_spec_generate_runs_a_dflash2_drafter_like_the_reference(tmp_path):
    from reference_dflash import reference_drafter, run_reference

    from dflash_trt import DFlash2Drafter, DFlashDrafter
    from dflash_trt.testing import make_tiny_drafter, make_tiny_target

    target = make_tiny_target("qwen3", vocab_size=24, logit_scale=3.0, seed=5)
    make_tiny_drafter(target.config, tmp_path / "drafter", block_size=4, family="dflash2", seed=3,
                      sliding_window=5, is_causal=False)
    draft = DFlashDrafter.from_pretrained(str(tmp_path / "drafter"), dtype="auto", device_map="cpu").eval()
    assert isinstance(draft, DFlash2Drafter)
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    output = draft.spec_generate(input_ids=prompt, max_new_tokens=17, temperature=0.0, target=target,
                                 stop_token_ids=None)
    tokens, _, _ = run_reference(reference_drafter(draft), target, prompt[0].tolist(), 17)
    assert output[0, prompt.shape[1]:].tolist() == tokens
