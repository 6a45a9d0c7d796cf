"""gpu-check section: what a tree verify costs on the GPU against the chain's, and the speedup that implies.

At a `context`-token cache, for batch 1 and 8: one autoregressive step (t_AR), the chain's verify of a 16-token
block (t_verify16, causal), one draft with each slot's top-K (what a tree needs), and tree verifies of 16, 32, 64
and 128 nodes (root + nodes, an ancestor-only mask, positions by depth: the layout step/verify/tree.py builds).
Each tree's implied speedup is taken at DDTree's measured acceptance (arXiv 2604.12989, Qwen3-8B on MATH-500,
H200, greedy: tau 7.79 with the chain, 10.73 with the tree), beside the chain's at 7.79:

    speedup = tau x t_AR / (t_draft + t_verify)

The tree is a fixed shape with the greedy spine as deep as the block allows and the other nodes as siblings
along it (a drafter's near misses); its cost depends on its node count and mask, not on which tokens it holds.
Every tree forward's spine must choose the tokens a chain forward of the spine chooses (greedy): a wrong mask or
wrong positions show up as a `spine_agreement` below MIN_SPINE_AGREEMENT, and the section fails. That check runs on
a shallow fp32 pair (`spine_pair`): in bf16 at full depth a 129-row forward and a 16-row one round differently, and
a random target's near-ties flipped 1 or 2 of 16 choices on an H200 with a correct mask.
"""

from __future__ import annotations

import torch

from dflash_trt.gpu_check.kernel_checks import time_us
from dflash_trt.gpu_check.report import Section, implied_speedup

DDTREE_TAU_CHAIN, DDTREE_TAU_TREE = 7.79, 10.73
TREE_BUDGETS = (16, 32, 64, 128)
CHAIN_BLOCK = 16
MIN_SPINE_AGREEMENT = 0.95  # the fp32 spine pair leaves no near-ties in practice; a wrong mask flips most choices


def tree_shape(budget: int, max_depth: int) -> tuple[list[int], list[int]]:
    """(parents, depths) of `budget` nodes (parent -1: the root): a spine down to max_depth, then siblings placed
    round-robin under the spine's nodes, shallow first. Parents come before their children."""
    parents, depths = [], []
    for depth in range(1, min(budget, max_depth) + 1):  # the spine: node d - 1 sits at depth d
        parents.append(depth - 2)
        depths.append(depth)
    spine = len(parents)
    for i in range(budget - spine):
        depth = 1 + i % spine  # a sibling of spine node depth - 1, under that node's parent
        parents.append(depth - 2)
        depths.append(depth)
    return parents, depths


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """[N + 1, N + 1] bool over [root, nodes...]: each slot sees itself, the root and its ancestors."""
    n = len(parents) + 1
    mask = torch.eye(n, dtype=torch.bool)
    mask[:, 0] = True
    for node, parent in enumerate(parents):
        if parent >= 0:
            mask[node + 1] |= mask[parent + 1]
    return mask


def tree_inputs(budget: int, max_depth: int, batch: int, context: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions [B, N + 1], block mask [B, N + 1, N + 1]) of the tree verify at a `context`-token cache."""
    parents, depths = tree_shape(budget, max_depth)
    positions = context + torch.tensor([0] + depths, device=device)[None, :].expand(batch, -1)
    mask = ancestor_mask(parents).to(device)[None].expand(batch, -1, -1)
    return positions, mask


def prefilled_verify(target, layer_ids, batch: int, context: int, budget: int):
    """(verify, tokens): `verify(n, positions=None, mask=None)` runs the target over the first n of `tokens` on a
    cache prefilled with `context` random tokens per row (chain layout unless positions and a block mask are
    given); every call writes the same slots."""
    device = target.device
    g = torch.Generator(device=device).manual_seed(batch)
    prompt = torch.randint(0, target.vocab_size - 1, (batch, context), device=device, generator=g)
    prefill = target.new_cache()
    with torch.inference_mode():
        target.forward(prompt, torch.arange(context, device=device)[None, :].expand(batch, -1),
                       torch.ones(batch, context, dtype=torch.long, device=device), prefill, layer_ids,
                       last_only=True)
    cache = target.batch_cache(prefill, torch.full((batch,), context, device=device), context + budget + 1)
    tokens = torch.randint(0, target.vocab_size - 1, (batch, budget + 1), device=device, generator=g)

    def verify(n: int, positions=None, mask=None):
        with torch.inference_mode():
            masks = cache.prepare(n) if mask is None else cache.prepare(n, positions, mask)
            return target.forward(tokens[:, :n], positions if positions is not None else
                                  context + torch.arange(n, device=device)[None, :].expand(batch, -1),
                                  masks, cache, layer_ids)

    return verify, tokens


def tree_verify_times(target, drafter, batches=(1, 8), context: int = 1024, budgets=TREE_BUDGETS,
                      iterations: int = 10, top_k: int = 8, spine_pair=None) -> Section:
    """Times on (target, drafter); the spine check on `spine_pair` (default: the same pair). On a GPU the timed
    pair is bf16 at full depth, where a 129-row and a 16-row forward round differently and random weights leave
    near-ties; the spine check then runs on a shallow fp32 pair, whose decisions are exact (as the greedy section's)."""
    section = Section(f"tree verify times ({context}-token context) and the speedup implied at DDTree's tau "
                      f"{DDTREE_TAU_CHAIN} -> {DDTREE_TAU_TREE}")
    device = target.device
    layer_ids = drafter.config.target_layer_ids
    spine_target, spine_drafter = spine_pair or (target, drafter)
    max_depth = CHAIN_BLOCK - 1
    wrong = 0
    for batch in batches:
        verify, tokens = prefilled_verify(target, layer_ids, batch, context, max(budgets))
        spine_verify = verify if spine_pair is None else prefilled_verify(
            spine_target, spine_drafter.config.target_layer_ids, batch, context, max(budgets))[0]
        t_ar = time_us(lambda: verify(1), iterations=iterations)
        t_chain = time_us(lambda: verify(CHAIN_BLOCK), iterations=iterations)
        with torch.inference_mode():
            draft_cache = drafter.new_cache(batch, context + 2 * CHAIN_BLOCK)
            features = torch.randn(batch, 7, len(layer_ids) * drafter.config.hidden_size, device=device,
                                   dtype=next(drafter.parameters()).dtype)
            ctx_lens = torch.full((batch,), 7, dtype=torch.long, device=device)
            start = torch.full((batch,), context - 7, dtype=torch.long, device=device)

            def draft():
                draft_cache.lens = start
                drafter.propose(target, tokens[:, :CHAIN_BLOCK], features, ctx_lens, draft_cache, top_k=top_k)

            t_draft = time_us(draft, iterations=iterations)
        chain_speedup = implied_speedup(DDTREE_TAU_CHAIN, t_ar, t_draft, t_chain)
        for budget in budgets:
            positions, mask = tree_inputs(budget, max_depth, batch, context, device)
            t_tree = time_us(lambda: verify(budget + 1, positions, mask), iterations=iterations)
            agreement = spine_agreement(spine_verify, budget, max_depth, positions, mask)
            wrong += 0 if agreement >= MIN_SPINE_AGREEMENT else 1
            tree_speedup = implied_speedup(DDTREE_TAU_TREE, t_ar, t_draft, t_tree)
            section.rows.append({"batch": batch, "nodes": budget, "t_AR_ms": t_ar / 1e3,
                                 "t_draft_topk_ms": t_draft / 1e3,
                                 "t_verify16_chain_ms": t_chain / 1e3, "t_verify_tree_ms": t_tree / 1e3,
                                 "tree_over_chain": t_tree / t_chain,
                                 "implied_speedup_chain": chain_speedup, "implied_speedup_tree": tree_speedup,
                                 "tree_pays": tree_speedup > chain_speedup, "spine_agreement": agreement})
        del verify, spine_verify, draft_cache
        if device.type == "cuda":
            torch.cuda.empty_cache()
    section.message = "a tree pays where implied_speedup_tree > implied_speedup_chain"
    if wrong:
        section.status, section.message = "fail", (f"a tree forward's spine chose other tokens than the chain "
                                                   f"forward of the spine in {wrong} cases (mask or positions wrong)")
    return section


def spine_agreement(verify, budget: int, max_depth: int, positions, mask) -> float:
    """The share of the spine's slots [root, spine nodes] where the tree forward's greedy choice equals a chain
    forward's over the same tokens (the spine's slots come first, in order, at consecutive positions: the
    chain's own layout). 1.0 up to bf16 near-ties; a wrong mask or position drops it far lower."""
    spine = 1 + min(budget, max_depth)
    tree_choice = verify(budget + 1, positions, mask).logits[:, :spine].argmax(-1)
    chain_choice = verify(spine).logits.argmax(-1)
    return float((tree_choice == chain_choice).float().mean())
