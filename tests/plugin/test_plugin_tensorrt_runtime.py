"""The tensorrt runtime's drafter against a stand-in for TensorRT's Python API (TensorRT is not installed here).

The stand-in engine binds tensors by address, exactly as TensorRT does, and computes the exported graph's maths
(plugin.export.ExportGraph, the CPU twin as the plugin) on the bound memory. So the test checks what TensorRTDrafter
owns: the plugin library is loaded, every input and output is bound with the right shape, the cache outputs are
bound to the cache inputs' memory (updated in place), torch's stream is passed, and the result equals the PyTorch
drafter's.
"""

from __future__ import annotations

import copy
import ctypes
import sys
import types

import pytest
import torch

from dflash_trt.decoding.model.exported.export import ExportGraph, cache_names
from dflash_trt.decoding.model.exported.head import draft_head
from dflash_trt.errors import DFlashError
from dflash_trt.testing import make_tiny_drafter, make_tiny_target


def memory_view(address: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    count = 1
    for size in shape:
        count *= size
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer((ctypes.c_char * max(nbytes, 1)).from_address(address), dtype=dtype,
                            count=count).view(shape)


class FakeTensorRT(types.ModuleType):
    """The subset of `tensorrt` the drafter uses; engines are ExportGraphs registered under their plan bytes."""

    class DataType:
        FLOAT, HALF, BF16, INT32 = "float", "half", "bf16", "int32"

    class Logger:
        WARNING = 2

        def __init__(self, level):
            self.level = level

    def __init__(self):
        super().__init__("tensorrt")
        self.loaded: list[str] = []
        self.graphs: dict[bytes, ExportGraph] = {}
        self.streams: list[int] = []
        outer = self

        class Registry:
            def load_library(self, path):
                outer.loaded.append(path)

        class Context:
            def __init__(self, graph):
                self.graph, self.shapes, self.addresses = graph, {}, {}

            def set_input_shape(self, name, shape):
                self.shapes[name] = tuple(shape)
                return True

            def set_tensor_address(self, name, address):
                self.addresses[name] = address
                return True

            def execute_async_v3(self, stream):
                outer.streams.append(stream)
                layers = self.graph.drafter.config.num_hidden_layers
                dtypes = {"cache_lens": torch.int32, "ctx_lens": torch.int32}
                names = ["block_embeds", "features", "cache_lens", "ctx_lens", *cache_names(layers)]
                args = [memory_view(self.addresses[n], self.shapes[n], dtypes.get(n, torch.float32)) for n in names]
                hidden, *caches = self.graph(*[a.clone() for a in args])
                memory_view(self.addresses["hidden"], tuple(hidden.shape), hidden.dtype).copy_(hidden)
                for name, value in zip(cache_names(layers, "_out"), caches):
                    memory_view(self.addresses[name], tuple(value.shape), value.dtype).copy_(value)
                return True

        class Engine:
            def __init__(self, graph):
                self.graph = graph

            def get_tensor_dtype(self, name):
                return FakeTensorRT.DataType.FLOAT

            def create_execution_context(self):
                return Context(self.graph)

        class Runtime:
            def __init__(self, logger):
                pass

            def deserialize_cuda_engine(self, data):
                return Engine(outer.graphs[data]) if data in outer.graphs else None

        self.Runtime = Runtime
        self.get_plugin_registry = lambda: Registry()


@pytest.fixture()
def fake_trt(monkeypatch):
    fake = FakeTensorRT()
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    return fake


@pytest.fixture(scope="module", params=["dflash", "dflash2"])
def pair(request):
    target = make_tiny_target("qwen3", hidden_size=256)  # head_dim 64, a size the plugin supports
    return target, make_tiny_drafter(target.config, num_layers=2, family=request.param)


def open_drafter(fake, pair, tmp_path):
    from dflash_trt.decoding.model.exported.tensorrt import TensorRTDrafter

    _, drafter = pair
    plan, library = tmp_path / "drafter.plan", tmp_path / "libdflash_attention_trt.so"
    plan.write_bytes(b"engine-1")
    library.write_bytes(b"")
    fake.graphs[b"engine-1"] = ExportGraph(drafter).eval()
    head = draft_head(copy.deepcopy(drafter))  # the host part: embeddings in, draft choice out
    return TensorRTDrafter(plan, head, plugin_library=library, device="cpu"), library


def test_drafts_like_the_pytorch_drafter_and_updates_caches_in_place(fake_trt, pair, tmp_path, cpu_library):
    _, drafter = pair
    trt_drafter, library = open_drafter(fake_trt, pair, tmp_path)
    assert fake_trt.loaded == [str(library)]
    config = drafter.config
    g = torch.Generator().manual_seed(0)
    batch, ctx = 2, 5
    block = torch.randn(batch, config.block_size, config.hidden_size, generator=g)
    features = torch.randn(batch, ctx, config.num_target_features * config.hidden_size, generator=g)
    ctx_lens = torch.tensor([5, 3])
    ours, ref = trt_drafter.new_cache(batch, 32), drafter.new_cache(batch, 32)
    cache_memory = [t.data_ptr() for t in ours.k + ours.v]
    with torch.inference_mode():
        for _ in range(2):  # two steps: the second attends to the first's appended context
            hidden = trt_drafter(block, features, ctx_lens, ours)
            expected = drafter(block, features, ctx_lens, ref)
            torch.testing.assert_close(hidden, expected, rtol=1e-4, atol=1e-4)
    assert torch.equal(ours.lens, ref.lens) and ours.lens.tolist() == [10, 6]
    assert [t.data_ptr() for t in ours.k + ours.v] == cache_memory  # the same buffers, written in place
    for mine, theirs in zip(ours.k + ours.v, ref.k + ref.v):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
    assert fake_trt.streams == [0, 0]  # CPU stand-in: no CUDA stream; on CUDA, torch's current stream


def test_propose_returns_draft_tokens_through_the_target_head(fake_trt, pair, tmp_path, cpu_library):
    target_model, drafter = pair
    from dflash_trt.decoding.model.target import TargetModel

    target = TargetModel(target_model)
    trt_drafter, _ = open_drafter(fake_trt, pair, tmp_path)
    block = torch.randint(0, 200, (1, drafter.config.block_size))
    features = torch.randn(1, 4, drafter.config.num_target_features * drafter.config.hidden_size)
    ctx_lens = torch.tensor([4])
    drafts = trt_drafter.propose(target, block, features, ctx_lens, trt_drafter.new_cache(1, 16))
    expected = drafter.propose(target, block, features, ctx_lens, drafter.new_cache(1, 16))
    if drafter.config.family == "dflash2":  # the selector's proposal: drafts, candidates and their q
        assert torch.equal(drafts.candidates, expected.candidates)
        torch.testing.assert_close(drafts.q, expected.q, rtol=0, atol=1e-5)
    drafts, expected = drafts.drafts, expected.drafts
    assert drafts.shape == (1, drafter.config.block_size - 1) and torch.equal(drafts, expected)


def test_missing_plugin_library_or_engine_is_one_clear_error(fake_trt, pair, tmp_path):
    from dflash_trt.decoding.model.exported.tensorrt import TensorRTDrafter

    _, drafter = pair
    (tmp_path / "drafter.plan").write_bytes(b"unknown")
    with pytest.raises(DFlashError, match="plugin library"):
        TensorRTDrafter(tmp_path / "drafter.plan", drafter, plugin_library=tmp_path / "none.so", device="cpu")
    (tmp_path / "lib.so").write_bytes(b"")
    with pytest.raises(DFlashError, match="could not deserialize"):
        TensorRTDrafter(tmp_path / "drafter.plan", drafter, plugin_library=tmp_path / "lib.so", device="cpu")


def test_decoding_through_a_shortened_last_block_equals_the_pytorch_drafter(fake_trt, pair, tmp_path, cpu_library):
    # max_new_tokens that are no multiple of the block make the last block shrink, for one row only: the engine
    # has no block mask, so those rows must run as their own sub-batch on their own length.
    from dflash_trt.decoding.api import generate
    from dflash_trt.decoding.model.target import TargetModel
    from dflash_trt.decoding.step.sampling import SamplingParams

    target_model, drafter = pair
    target = TargetModel(target_model)
    trt_drafter, _ = open_drafter(fake_trt, pair, tmp_path)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    params = [SamplingParams(max_new_tokens=n, stop_token_ids=()) for n in (7, 12)]
    params += [SamplingParams(max_new_tokens=9, stop_token_ids=(), temperature=0.8, seed=5)]  # a sampled row
    prompts.append([12, 13])
    ours = generate(target, trt_drafter, prompts, params)
    reference = generate(target, drafter, prompts, params)
    assert [r.token_ids for r in ours] == [r.token_ids for r in reference]
    assert [r.acceptance_lengths for r in ours] == [r.acceptance_lengths for r in reference]


def test_a_tree_with_the_tensorrt_drafter_equals_the_pytorch_drafters_tree(fake_trt, pair, tmp_path, cpu_library):
    """The engine's states through the host head: each slot's top-K (DFlash2: the lattice), so the same tree."""
    from dflash_trt.decoding.api import generate
    from dflash_trt.decoding.model.target import TargetModel
    from dflash_trt.decoding.step.sampling import SamplingParams
    from dflash_trt.decoding.step.verify import TreeVerify

    target_model, drafter = pair
    target = TargetModel(target_model)
    trt_drafter, _ = open_drafter(fake_trt, pair, tmp_path)
    assert trt_drafter.proposes_top_k
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    params = [SamplingParams(max_new_tokens=n, stop_token_ids=()) for n in (7, 12)]  # a shortened last block
    plain = generate(target, None, prompts, params, block_size=1)
    ours = generate(target, trt_drafter, prompts, params, method=TreeVerify(10, 3))
    reference = generate(target, drafter, prompts, params, method=TreeVerify(10, 3))
    assert [r.token_ids for r in ours] == [r.token_ids for r in reference] == [r.token_ids for r in plain]
    assert [r.acceptance_lengths for r in ours] == [r.acceptance_lengths for r in reference]


@pytest.fixture(scope="module")
def qwen3_target():
    # Built before the TensorRT stand-in is installed (transformers' lazy imports probe for `tensorrt`).
    return make_tiny_target("qwen3", hidden_size=256)


@pytest.mark.parametrize("family, settings", [
    ("dflash", {"input_embedding_scale": 1.7}),  # the block embeddings going into the graph are scaled
    ("dflash2", {"input_embedding_scale": 1.7, "output_multiplier": 0.5, "final_logit_softcapping": 3.0}),
])
def test_exported_drafters_keep_the_checkpoints_embedding_scale_and_logit_transforms(qwen3_target, fake_trt, tmp_path,
                                                                                   cpu_library, family, settings):
    # A DFlash2 selector scores candidates by their logit values, so the multiplier and softcapping move its drafts.
    from dflash_trt.decoding.model.target import TargetModel

    target_model = qwen3_target
    drafter = make_tiny_drafter(target_model.config, num_layers=2, family=family, **settings)
    trt_drafter, _ = open_drafter(fake_trt, (target_model, drafter), tmp_path)
    target = TargetModel(target_model)
    g = torch.Generator().manual_seed(3)
    block = torch.randint(0, 200, (2, drafter.config.block_size), generator=g)
    features = torch.randn(2, 4, drafter.config.num_target_features * drafter.config.hidden_size, generator=g)
    ctx_lens = torch.tensor([4, 3])
    got = trt_drafter.propose(target, block, features, ctx_lens, trt_drafter.new_cache(2, 16))
    expected = drafter.propose(target, block, features, ctx_lens, drafter.new_cache(2, 16))
    if family == "dflash2":
        assert torch.equal(got.candidates, expected.candidates)
        torch.testing.assert_close(got.q, expected.q, rtol=0, atol=1e-5)
    got, expected = got.drafts, expected.drafts
    assert torch.equal(got, expected)
