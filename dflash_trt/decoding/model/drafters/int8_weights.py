"""A torch drafter's linear layers as Q8_0 blocks (int8 codes, a float16 scale per 32 weights), for CPU decoding
beside a target at its GGUF precision.

A draft call of the demo drafter reads its float32 weights (~35 MB: the context projection and two layers) for a
handful of rows, and on one core those bytes set its time (~1.5 ms of a ~4.4 ms draft). As Q8_0 blocks run by the
target's block kernels (kernels/block_quant.py) it reads ~9 MB. Drafts are only proposals that the target
verifies, so the output does not change (lossless); acceptance barely does: tau 1.796 in float32, 1.792 as Q8_0
(demo pair, 8 held-out chat prompts, 96 tokens). The blocks come from ggml's own Q8_0 quantizer (the `gguf`
package), as a GGUF file would hold them.

`--drafter-weights auto` (the default) takes Q8_0 where the target runs at its GGUF precision and the drafter is a
float32 torch drafter on CPU; `float` keeps the drafter as loaded; `q8_0` asks for the blocks (a CPU torch
drafter).
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_trt.errors import ConfigError

WEIGHTS = ("auto", "float", "q8_0")


def quantize_linear_layers(module: nn.Module) -> int:
    """Replace every bias-free linear layer of `module` whose input width is a multiple of 32 by a Q8_0
    BlockQuantLinear; returns how many."""
    import gguf
    from gguf import quants

    from dflash_trt.decoding.kernels.block_quant import GROUP, BlockQuantLinear
    from dflash_trt.decoding.model.gguf_weights import decode_blocks

    count = 0
    for owner in list(module.modules()):
        for name, child in list(owner.named_children()):
            if isinstance(child, nn.Linear) and child.bias is None and child.in_features % GROUP == 0:
                weight = child.weight.detach().float().cpu().numpy()
                raw = quants.quantize(weight, gguf.GGMLQuantizationType.Q8_0)
                setattr(owner, name, BlockQuantLinear(decode_blocks(raw, "Q8_0")))
                count += 1
    return count


def apply_drafter_weights(weights: str, target, drafter) -> bool:
    """Give `drafter` (a torch drafter, or None) the weights `weights` asks for beside `target`; returns whether
    its layers are Q8_0 blocks now."""
    from dflash_trt.decoding.model.drafters.base import DrafterBase

    if weights not in WEIGHTS:
        raise ConfigError(f"drafter weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    if drafter is None or weights == "float":
        return False
    usable = isinstance(drafter, DrafterBase) and drafter.device.type == "cpu"
    if weights == "q8_0" and not usable:
        raise ConfigError("--drafter-weights q8_0 needs a torch drafter on CPU; use --drafter-weights float")
    if weights == "auto" and not (usable and getattr(target, "weights", "float") == "gguf"
                                  and drafter.norm.weight.dtype == torch.float32):
        return False
    if quantize_linear_layers(drafter) == 0:
        return False
    from dflash_trt.decoding.model.drafters.native_layers import NativeDraftLayers

    drafter.native_layers, _ = NativeDraftLayers.build(drafter)  # where it does not apply, the torch layers run
    return True
