"""Weight-only int4 linear layers at a GGUF's shipped precision (kernels/int4_linear.py, model/gguf_weights.py).

The oracle for the block layouts is the `gguf` package's own quantize/dequantize (ggml's reference code).
"""

import gguf
import numpy as np
import pytest
import torch
from core_oracle import OracleDrafter
from gguf import quants

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.kernels.int4_linear import Int4Linear, Int4Plane, int4_available
from dflash_trt.decoding.model.gguf_weights import decode_blocks
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.decoding.step.verify import TreeVerify
from dflash_trt.errors import ConfigError
from dflash_trt.testing import make_tiny_drafter, make_tiny_target, tiny_drafter_config

pytestmark = pytest.mark.skipif(not int4_available(), reason="this PyTorch has no CPU int4 kernel")

TYPES = ("Q4_0", "Q4_1", "Q8_0")
# Int4Linear rounds its output to bf16 (the kernel's output type): 2^-8 relative, of the largest output.
OUTPUT_TOLERANCE = 2 ** -8


def _quantized(kind: str, rows: int = 96, cols: int = 192, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(raw GGUF blocks, their float32 dequantization by ggml's reference code)."""
    weights = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    raw = quants.quantize(weights, gguf.GGMLQuantizationType[kind])
    return raw, quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).astype(np.float32)


@pytest.mark.parametrize("kind", TYPES)
def test_blocks_decode_to_ggml_dequantization(kind):
    raw, reference = _quantized(kind)
    planes = decode_blocks(raw, kind)
    assert all(p.codes.dtype == torch.uint8 and int(p.codes.max()) <= 15 for p in planes)
    rebuilt = sum(p.dequantize() for p in planes)
    torch.testing.assert_close(rebuilt, torch.from_numpy(reference), rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", TYPES)
def test_int4_matmul_equals_dequantized_float_matmul(kind):
    raw, reference = _quantized(kind)
    planes = decode_blocks(raw, kind)
    x = torch.randn(8, reference.shape[1], generator=torch.Generator().manual_seed(1))
    out = Int4Linear(planes)(x)
    assert out.dtype == torch.float32
    # Against the weights the kernel holds (bf16 scales) with the same bf16 activations: output rounding only.
    kernel = x.to(torch.bfloat16).float() @ sum(p.kernel_weight() for p in planes).T
    scale = kernel.abs().max()
    assert (out - kernel).abs().max() <= OUTPUT_TOLERANCE * scale * len(planes)
    # Against ggml's dequantized float32 weights and float32 activations: bf16 scales and activations too.
    exact = x @ torch.from_numpy(reference).T
    assert (out - exact).abs().max() <= 2 ** -5 * exact.abs().max()


def test_wrong_block_layout_is_caught():
    raw, reference = _quantized("Q4_1")
    swapped = raw.reshape(raw.shape[0], -1, 20)[..., [2, 3, 0, 1] + list(range(4, 20))]  # d and m swapped
    rebuilt = decode_blocks(np.ascontiguousarray(swapped).reshape(raw.shape), "Q4_1")[0].dequantize()
    assert not torch.allclose(rebuilt, torch.from_numpy(reference), atol=1e-3)
    with pytest.raises(ConfigError, match="--weights float32"):
        decode_blocks(raw, "Q5_K")


@pytest.mark.parametrize("kind", ("Q4_1", "Q8_0"))
def test_each_row_is_independent_of_the_rows_beside_it(kind):
    """Batch invariance, bit for bit: what makes a verify forward of B tokens equal B one-token steps."""
    raw, _ = _quantized(kind, rows=256, cols=576)
    layer = Int4Linear(decode_blocks(raw, kind))
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


def _quantize_like_q4_1(model) -> int:
    """Every linear layer of a tiny model as Q4_1 blocks (its head as Q8_0), through ggml's own quantizer."""
    count = 0
    for owner in list(model.modules()):
        for name, child in list(owner.named_children()):
            if isinstance(child, torch.nn.Linear) and child.bias is None:
                kind = "Q8_0" if child is model.get_output_embeddings() else "Q4_1"
                raw = quants.quantize(child.weight.detach().numpy(), gguf.GGMLQuantizationType[kind])
                setattr(owner, name, Int4Linear(decode_blocks(raw, kind)))
                count += 1
    return count


@pytest.fixture(scope="module")
def quantized_setup():
    model = make_tiny_target("llama", seed=3)
    assert _quantize_like_q4_1(model) == 1 + 7 * model.config.num_hidden_layers
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 250, (int(n),), generator=generator).tolist()
               for n in torch.randint(1, 20, (12,), generator=generator)]
    with torch.inference_mode():
        references = [model.generate(torch.tensor([p]), max_new_tokens=23, min_new_tokens=23,
                                     do_sample=False)[0, len(p):].tolist() for p in prompts]
    return model, prompts, references


@pytest.mark.parametrize("block_size", (1, 2, 4, 8, 16))
def test_quantized_dflash_greedy_equals_plain_decoding(quantized_setup, block_size):
    model, prompts, references = quantized_setup
    random = make_tiny_drafter(model.config, block_size=block_size)
    oracle = OracleDrafter(tiny_drafter_config(model.config, block_size=block_size),
                           [p + r for p, r in zip(prompts, references)])
    oracle.load_state_dict(random.state_dict())
    for name, drafter in (("random", random), ("oracle", oracle)):
        results = generate(TargetModel(model), drafter, prompts, SamplingParams(max_new_tokens=23), block_size)
        for index, (result, reference) in enumerate(zip(results, references)):
            assert result.token_ids == reference, f"{name} drafter, block {block_size}, prompt {index}"
        if name == "oracle" and block_size > 2:
            assert max(max(r.acceptance_lengths) for r in results) >= 3  # verify forwards of many rows ran


@pytest.mark.parametrize("budget", (4, 16))
def test_quantized_tree_verification_equals_plain_decoding(quantized_setup, budget):
    model, prompts, references = quantized_setup
    drafter = make_tiny_drafter(model.config, block_size=8)
    results = generate(TargetModel(model), drafter, prompts, SamplingParams(max_new_tokens=23), 8,
                       method=TreeVerify(budget, 4))
    assert [r.token_ids for r in results] == references


def test_plane_shapes_are_checked():
    plane = Int4Plane(torch.zeros(4, 48, dtype=torch.uint8), torch.ones(4, 1), torch.zeros(4, 1))
    with pytest.raises(ValueError, match="multiple of the group size"):
        Int4Linear([plane])
