"""Runs z-lab's reference implementation (PyPI `dflash` 0.1.0) on this project's random-weight drafters.

The reference builds its modules from a Qwen3 config; this project's state dict loads into them once the
codebooks get the `.weight` suffix of the reference's nn.Embedding. Two harness changes, none in the model:
its timer calls torch.cuda.synchronize (replaced by a CPU clock), and its draft cache is a plain
DynamicCache, because a sliding DynamicCache of transformers 5 refuses the crop the loop makes once the
context passes the window; the reference's own mask then applies the window (|P - p| < W).
"""

from __future__ import annotations

import time

import pytest
import torch

dflash_model = pytest.importorskip("dflash.model", reason="the reference package `dflash` 0.1.0 is not installed")


def reference_drafter(drafter):
    """The reference module of `drafter`'s family, with the same weights."""
    from transformers import Qwen3Config

    config = Qwen3Config(**drafter.config.to_dict())
    cls = dflash_model.DFlash2DraftModel if drafter.config.family == "dflash2" else dflash_model.DFlashDraftModel
    model = cls(config).float().eval()
    state = {}
    for name, tensor in drafter.state_dict().items():
        if name.endswith("_codebook"):
            name += ".weight"
        state[name] = tensor
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in name for name in missing), (missing, unexpected)
    return model


def run_reference(model, target_model, prompt, max_new_tokens, temperature=0.0, stop_token_ids=None):
    """(new token ids, acceptance lengths, verify blocks) of the reference's dflash_generate."""
    from transformers import DynamicCache

    blocks = []

    def record(_module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        blocks.append(ids[0].tolist())

    hook = target_model.register_forward_pre_hook(record, with_kwargs=True)
    patch = pytest.MonkeyPatch()
    patch.setattr(dflash_model, "_cuda_time", time.perf_counter)
    patch.setattr(dflash_model, "_make_cache", lambda config: DynamicCache())
    try:
        out = dflash_model.dflash_generate(model, target_model, torch.tensor([prompt]), max_new_tokens,
                                           stop_token_ids, temperature=temperature, return_stats=True)
    finally:
        patch.undo()
        hook.remove()
    return out.output_ids[0, len(prompt):].tolist(), list(out.acceptance_lengths), blocks[1:]


def record_verify_blocks(target_model):
    """Start recording every verify block this HF model sees; returns (the list, a remover)."""
    blocks = []

    def record(_module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        blocks.extend(row.tolist() for row in ids)

    return blocks, target_model.register_forward_pre_hook(record, with_kwargs=True)
