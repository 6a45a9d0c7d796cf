"""The step-times section's graphed verify: t_AR and t_verify(16) through GraphedVerifier (one CUDA graph per step
shape) on a prefilled context, and whether the graphed step's greedy tokens equal the same static step run eagerly.
"""

from __future__ import annotations

import torch

from dflash_trt.gpu_check.kernel_checks import time_us


def graphed_verify(target, prefill_cache, prompt: torch.Tensor, context: int, block: int, layer_ids,
                   iterations: int) -> dict:
    """Times (microseconds) of the graphed AR step and verify of `block` tokens over `prefill_cache` (a
    DynamicCache holding `context` tokens of every row of `prompt`), and the token check.

    The steps write at the same slots every time (the lengths stay at `context`), as the eager timing does."""
    from dflash_trt.decoding.model.graphs.verifier import GraphedVerifier

    batch, device = prompt.shape[0], prompt.device
    graphed, eager = GraphedVerifier(target), GraphedVerifier(target, graphs=False)
    lengths = torch.full((batch,), context, dtype=torch.long, device=device)
    cache = graphed.batch_cache(prefill_cache, lengths, context + 2 * block)

    def step(verifier, tokens: int, ids=()):
        cache.prepare(tokens)
        positions = context + torch.arange(tokens, device=device)[None, :].expand(batch, -1)
        return verifier.forward(prompt[:, :tokens], positions, None, cache, ids)

    # The eager static run first: it leaves the step's StaticForward to the graphed verifier, which captures it.
    expected = torch.argmax(step(eager, block, layer_ids).logits, dim=-1)
    got = torch.argmax(step(graphed, block, layer_ids).logits, dim=-1)
    t_verify = time_us(lambda: step(graphed, block, layer_ids), iterations=iterations)
    t_ar = time_us(lambda: step(graphed, 1), iterations=iterations)
    captured = sum(f.graph is not None for f in cache.forwards.values())
    return {"t_AR_us": t_ar, "t_verify_us": t_verify, "tokens_equal": bool(torch.equal(expected, got)),
            "graphs": captured}
