"""gpu-check sections with whole models: the decoding loop on CUDA against transformers' greedy generate, and the
step times t_AR, t_draft, t_verify(16) with the speedup they imply.

The target is a random-weight Qwen3 at Qwen3-8B's width (hidden 4096, 32/8 heads, head_dim 128, FFN 12288, vocab
151936; 36 layers unless told otherwise) and the drafter a random-weight DFlash drafter of the same width (5 layers,
block 16), both built directly on the device in bf16. Random weights make the drafts poor (tau ~ 1), which does not
matter: the greedy output must equal the target's own, and the step times do not depend on the weights. The greedy
check runs an 8-layer pair in fp32 (exact decisions), with a fixed batch (the plain drafter, the graphed drafter,
both parts graphed) and with requests joining and leaving through the scheduler (both parts graphed,
join_leave.py); the step times the full-depth pair in bf16.
"""

from __future__ import annotations

import torch

from dflash_trt.gpu_check.join_leave import budgets, join_and_leave
from dflash_trt.gpu_check.kernel_checks import time_us
from dflash_trt.gpu_check.report import PAPER_TAU, Section, implied_speedup
from dflash_trt.gpu_check.verify_checks import graphed_verify

BLOCK = 16
DRAFT_LAYERS = 5
VOCAB = 151936


def build_pair(target_layers: int, device: str = "cuda", dtype: torch.dtype = torch.bfloat16):
    """A random-weight Qwen3-8B-width target with `target_layers` layers and a DFlash drafter, built on `device`."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from dflash_trt.decoding.model.config import DrafterConfig, default_target_layer_ids
    from dflash_trt.decoding.model.drafters import DFlashDrafter
    from dflash_trt.decoding.model.target import TargetModel

    config = Qwen3Config(vocab_size=VOCAB, hidden_size=4096, intermediate_size=12288, num_hidden_layers=target_layers,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                         rope_theta=1e6, tie_word_embeddings=False, eos_token_id=None, bos_token_id=None,
                         pad_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
        with torch.no_grad():  # well-separated greedy choices: equality compares decisions, not float noise
            model.get_output_embeddings().weight.mul_(8.0)
        drafter_config = DrafterConfig.from_dict({
            "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 4096,
            "intermediate_size": 12288, "num_hidden_layers": DRAFT_LAYERS, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": VOCAB, "block_size": BLOCK,
            "num_target_layers": target_layers, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "rope_scaling": None,
            "attention_bias": False, "max_position_embeddings": 40960,
            "dflash_config": {"target_layer_ids": default_target_layer_ids(target_layers, DRAFT_LAYERS),
                              "mask_token_id": VOCAB - 1}})
        drafter = DFlashDrafter(drafter_config).to(dtype).eval()
    return TargetModel(model, source="random Qwen3-8B-width target"), drafter


def greedy_equality(target, drafter, num_prompts: int = 4, prompt_len: int = 48, new_tokens: int = 32) -> Section:
    from dflash_trt.decoding.api import generate
    from dflash_trt.decoding.step.sampling import SamplingParams

    section = Section(f"decoding loop on CUDA vs transformers greedy generate ({target.num_layers}-layer target, "
                      f"{next(drafter.parameters()).dtype})")
    g = torch.Generator().manual_seed(1)
    vocab = target.vocab_size - 1  # the last id is the drafter's mask token
    prompts = [torch.randint(0, vocab, (prompt_len + 3 * i,), generator=g).tolist() for i in range(num_prompts)]
    from dflash_trt.decoding.model.graphs.drafter import GraphedDrafter
    from dflash_trt.decoding.model.graphs.verifier import GraphedVerifier

    params = SamplingParams(max_new_tokens=new_tokens)
    results = generate(target, drafter, prompts, params, block_size=BLOCK)
    graphed = generate(target, GraphedDrafter(drafter), prompts, params, block_size=BLOCK)
    # draft and verify both replaying CUDA graphs (on CPU, both static paths eagerly)
    both = generate(GraphedVerifier(target), GraphedDrafter(drafter), prompts, params, block_size=BLOCK)
    # the same parts with requests joining and leaving a running batch (spare rows, bucket changes, compaction)
    joined, stats = join_and_leave(target, drafter, prompts, new_tokens, BLOCK)
    mismatches = 0
    for i, (prompt, result, graphed_result, both_result) in enumerate(zip(prompts, results, graphed, both)):
        ids = torch.tensor([prompt], device=target.device)
        with torch.inference_mode():
            expected = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                             max_new_tokens=new_tokens, min_new_tokens=new_tokens)[0, len(prompt):]
        ours = list(result.token_ids)
        joined_same = joined.get(i) == expected.tolist()[:budgets(num_prompts, new_tokens)[i]]
        same = ours == expected.tolist() == list(graphed_result.token_ids) == list(both_result.token_ids)
        same = same and joined_same
        first = next((j for j, (a, b) in enumerate(zip(ours, expected.tolist())) if a != b), None)
        mismatches += 0 if same else 1
        section.rows.append({"prompt": i, "tokens": len(ours), "identical": same,
                             "graphed_drafts_equal": graphed_result.acceptance_lengths == result.acceptance_lengths,
                             "graphed_verify_identical": list(both_result.token_ids) == expected.tolist(),
                             "join_leave_identical": joined_same,
                             "first_difference": "" if same else first,
                             "tau": sum(result.acceptance_lengths) / max(len(result.acceptance_lengths), 1)})
    section.message = (f"join/leave run: up to {stats['max_rows']} rows together; graphs captured on the running "
                       f"batch at once: draft {stats['draft_graphs']}, verify {stats['verify_graphs']}")
    if mismatches:
        section.status, section.message = "fail", f"{mismatches} of {num_prompts} prompts differ from greedy generate"
    elif target.device.type == "cuda" and not (stats["draft_graphs"] and stats["verify_graphs"]):
        section.status = "fail"
        section.message = "the join/leave run replayed no CUDA graph of " + (
            "the draft" if not stats["draft_graphs"] else "the verify")
    return section


def step_times(target, drafter, batches=(1, 8, 32), context: int = 1024, new_rows: int = 7,
               iterations: int = 10) -> Section:
    """Times of one AR step, one draft (all drafter layers + the target's head on 15 slots) and one verify of a
    16-token block, at `context` cached tokens: eager, plus the draft through GraphedDrafter and the AR step and
    verify through GraphedVerifier (one CUDA graph each), whose greedy tokens must equal the eager static step's."""
    section = Section(f"step times (eager and graphed, {context}-token context) and the speedup implied at tau "
                      f"{PAPER_TAU}")
    device = target.device
    layer_ids = drafter.config.target_layer_ids
    bad_tokens = 0
    for batch in batches:
        g = torch.Generator(device=device).manual_seed(batch)
        prompt = torch.randint(0, target.vocab_size - 1, (batch, context), device=device, generator=g)
        cache = target.new_cache()
        positions = torch.arange(context, device=device)[None, :].expand(batch, -1)
        mask = torch.ones(batch, context, dtype=torch.long, device=device)
        target.forward(prompt, positions, mask, cache, layer_ids, last_only=True)

        def step(tokens: int, ids=()):
            pos = context + torch.arange(tokens, device=device)[None, :].expand(batch, -1)
            m = torch.ones(batch, context + tokens, dtype=torch.long, device=device)
            target.forward(prompt[:, :tokens], pos, m, cache, ids)
            cache.crop(context)

        t_ar = time_us(lambda: step(1), iterations=iterations)
        t_verify = time_us(lambda: step(BLOCK, layer_ids), iterations=iterations)
        verify = graphed_verify(target, cache, prompt, context, BLOCK, layer_ids, iterations)
        bad_tokens += 0 if verify["tokens_equal"] else 1

        draft_cache = drafter.new_cache(batch, context + 2 * BLOCK)
        start_lens = torch.full((batch,), context - new_rows, dtype=torch.long, device=device)
        features = torch.randn(batch, new_rows, len(layer_ids) * drafter.config.hidden_size, device=device,
                               dtype=next(drafter.parameters()).dtype)
        ctx_lens = torch.full((batch,), new_rows, dtype=torch.long, device=device)
        block = prompt[:, :BLOCK].clone()

        def draft():
            draft_cache.lens = start_lens
            drafter.propose(target, block, features, ctx_lens, draft_cache)

        with torch.inference_mode():
            t_draft = time_us(draft, iterations=iterations)
        from dflash_trt.decoding.model.graphs.drafter import GraphedDrafter

        graphed = GraphedDrafter(drafter)
        graphed_cache = graphed.new_cache(batch, context + 2 * BLOCK)

        def graphed_draft():
            graphed_cache.lens = start_lens
            graphed.propose(target, block, features, ctx_lens, graphed_cache)

        t_draft_graphed = time_us(graphed_draft, iterations=iterations)
        section.rows.append({"batch": batch, "t_AR_ms": t_ar / 1e3, "t_draft_ms": t_draft / 1e3,
                             "t_verify16_ms": t_verify / 1e3, "verify_over_AR": t_verify / t_ar,
                             "implied_speedup": implied_speedup(PAPER_TAU, t_ar, t_draft, t_verify),
                             "t_draft_graphed_ms": t_draft_graphed / 1e3,
                             "implied_speedup_graphed_draft": implied_speedup(PAPER_TAU, t_ar, t_draft_graphed,
                                                                              t_verify),
                             "t_AR_graphed_ms": verify["t_AR_us"] / 1e3,
                             "t_verify16_graphed_ms": verify["t_verify_us"] / 1e3,
                             "verify_over_AR_graphed": verify["t_verify_us"] / verify["t_AR_us"],
                             "implied_speedup_graphed": implied_speedup(PAPER_TAU, verify["t_AR_us"], t_draft_graphed,
                                                                        verify["t_verify_us"]),
                             "graphed_verify_tokens_equal": verify["tokens_equal"]})
        del cache, draft_cache, graphed_cache
        if device.type == "cuda":
            torch.cuda.empty_cache()
    section.message = "targets: t_verify(16)/t_AR <= 1.3 at batch 1; implied speedup >= 4.5 (the paper: 4.86x)"
    if bad_tokens:
        section.status, section.message = "fail", (f"graphed verify's greedy tokens differ from the eager static "
                                                   f"verify's at {bad_tokens} of {len(batches)} batch sizes")
    return section
