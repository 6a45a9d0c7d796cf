"""A Q8_0 drafter's layers as one native call (model/drafters/native_layers.py, kernels/native/draft_decoder.cpp): the
call computes what the drafter's torch layers compute over the same blocks (up to float rounding), appends the same
rows to the context cache, and applies only where it can.

That decoding stays lossless with it: test_core_block_quant.py (the tiny pair at every block size, with a "native"
drafter, and the demo pair, whose drafter gets it from apply_drafter_weights).
"""

import pytest
import torch

from dflash_trt.decoding.kernels import native
from dflash_trt.decoding.model.drafters.int8_weights import quantize_linear_layers
from dflash_trt.decoding.model.drafters.native_layers import NativeDraftLayers
from dflash_trt.testing import make_tiny_drafter, make_tiny_target

# Float rounding of another summation order in the attention, relative to the largest value compared.
TOLERANCE = 1e-5

# Three draft calls of a batch of 3: the new context rows per sequence (0: none this call) and the valid block
# slots (a shortened last block in some rows).
CALLS = (([5, 1, 9], [4, 4, 4]), ([1, 3, 0], [4, 2, 4]), ([2, 2, 2], [1, 4, 3]))


def _quantized_drafter(**config):
    model = make_tiny_target("llama")
    drafter = make_tiny_drafter(model.config, block_size=4, **config)
    assert quantize_linear_layers(drafter) > 0
    return drafter


def _close(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    return bool((actual - expected).abs().max() <= TOLERANCE * expected.abs().max())


@pytest.fixture(params=("vector", "scalar"))
def kernel_path(request):
    native.load()
    native.use_vector_kernels(request.param == "vector")
    yield request.param
    native.use_vector_kernels(True)


def test_native_layers_compute_the_torch_layers(kernel_path):
    drafter = _quantized_drafter()
    layers, reason = NativeDraftLayers.build(drafter)
    assert reason == "" and layers is not None
    config = drafter.config
    width = config.num_target_features * config.hidden_size
    generator = torch.Generator().manual_seed(0)
    caches = {"torch": drafter.new_cache(3, 64), "native": drafter.new_cache(3, 64)}
    for ctx_lens, block_lens in CALLS:
        block = torch.randn(3, 4, config.hidden_size, generator=generator)
        features = torch.randn(3, max(ctx_lens), width, generator=generator)  # rows past ctx_lens: padding
        ctx_lens, block_lens = torch.tensor(ctx_lens), torch.tensor(block_lens)
        states = {}
        for name, cache in caches.items():
            drafter.native_layers = layers if name == "native" else None
            with torch.inference_mode():
                states[name] = drafter(block, features, ctx_lens, cache, block_lens)
        assert _close(states["native"], states["torch"])
        assert torch.equal(caches["native"].lens, caches["torch"].lens)
        for mine, theirs in zip(caches["native"].k + caches["native"].v, caches["torch"].k + caches["torch"].v):
            for row, length in enumerate(caches["torch"].lens.tolist()):
                assert _close(mine[row, :, :length], theirs[row, :, :length])


def test_native_layers_see_the_context():
    """A different context changes the native layers' states (so the test above compares the attention over it)."""
    drafter = _quantized_drafter()
    drafter.native_layers, _ = NativeDraftLayers.build(drafter)
    config = drafter.config
    generator = torch.Generator().manual_seed(1)
    block = torch.randn(1, 4, config.hidden_size, generator=generator)
    features = torch.randn(2, 1, 6, config.num_target_features * config.hidden_size, generator=generator)
    with torch.inference_mode():
        first, second = (drafter(block, f, torch.tensor([6]), drafter.new_cache(1, 16)) for f in features)
    assert (first - second).abs().max() > 1e-3


@pytest.mark.parametrize("config, reason", [
    ({"family": "dflash2"}, "DFlash2Layer layers"),
    ({"sliding_window": 4}, "sliding-window or causal"),
    ({"is_causal": True}, "sliding-window or causal"),
])
def test_native_layers_apply_only_to_what_they_compute(config, reason):
    assert reason in NativeDraftLayers.build(_quantized_drafter(**config))[1]
    model = make_tiny_target("llama")
    assert NativeDraftLayers.build(make_tiny_drafter(model.config, block_size=4))[1] == "linear layers not as blocks"


def test_training_runs_the_torch_layers():
    """With gradients on (training), the drafter's own modules run even where native layers are set."""
    drafter = _quantized_drafter()
    drafter.native_layers, _ = NativeDraftLayers.build(drafter)
    calls = []
    drafter.layers[0].register_forward_hook(lambda *args: calls.append(1))
    config = drafter.config
    block = torch.randn(1, 4, config.hidden_size)
    features = torch.randn(1, 3, config.num_target_features * config.hidden_size)
    with torch.inference_mode():
        drafter(block, features, torch.tensor([3]), drafter.new_cache(1, 8))
    assert not calls
    drafter(block, features, torch.tensor([3]), drafter.new_cache(1, 8))
    assert calls


def test_a_padded_batch_projects_only_its_real_context_rows():
    """A catch-up pads every sequence's new context to the longest (zero features): the context projection (fc)
    sees only the real rows, and the states and cache equal those of projecting the padding too."""
    drafter = _quantized_drafter()
    drafter.native_layers, _ = NativeDraftLayers.build(drafter)
    config = drafter.config
    ctx_lens = torch.tensor([12, 1, 0, 3])
    generator = torch.Generator().manual_seed(2)
    features = torch.randn(4, 12, config.num_target_features * config.hidden_size, generator=generator)
    features[torch.arange(12)[None, :] >= ctx_lens[:, None]] = 0.0
    block = torch.randn(4, 4, config.hidden_size, generator=generator)
    projected = []
    drafter.fc.register_forward_hook(lambda module, args, out: projected.append(args[0].shape[:-1].numel()))
    states, caches = {}, {}
    for name in ("packed", "padded"):
        if name == "padded":
            drafter._fused_context = lambda f, lens: drafter.fuse_context(f)
        caches[name] = drafter.new_cache(4, 32)
        with torch.inference_mode():
            states[name] = drafter(block, features, ctx_lens, caches[name])
    assert projected == [16, 48]
    assert torch.equal(states["packed"], states["padded"])
    for mine, theirs in zip(caches["packed"].k + caches["packed"].v, caches["padded"].k + caches["padded"].v):
        assert torch.equal(mine, theirs)
