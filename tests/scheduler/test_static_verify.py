"""The static-shape verify (StaticKVCache + StaticForward, what GraphedVerifier captures on CUDA), run eagerly: the
tokens of Hugging Face's own greedy decoding with ragged rows joining and leaving; masks and positions per row; the
same logits and cache contents as the eager verify; a wrong position or a stale mask row does change tokens; and
Hugging Face's code path under it reads no tensor on the host (what a CUDA graph capture forbids), except where
capture_blockers says it does."""

from __future__ import annotations

import pytest
import torch
from conftest import oracle_for
from host_reads import HostReads

from dflash_trt.decoding.model.graphs.static_kv_cache import StaticForward, StaticKVCache
from dflash_trt.decoding.model.graphs.verifier import GraphedVerifier, capture_blockers
from dflash_trt.decoding.model.kv_cache import BatchKVCache, MaskSpec
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.scheduler.block_policy import FixedBlockSize
from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.errors import CompatibilityError
from dflash_trt.testing import make_tiny_drafter, make_tiny_target

NEW_TOKENS = 16
ARRIVALS = {0: [0, 1], 2: [2], 4: [3, 4]}  # step -> prompts arriving: groups join a running batch
LENGTHS = (1, 13, 4, 21, 9)


def _target(arch: str):
    if arch == "qwen3-sliding":  # sdpa, boolean masks, a {layer type: mask} mapping
        return make_tiny_target("qwen3", seed=3, use_sliding_window=True, sliding_window=8,
                                layer_types=["sliding_attention", "full_attention"] * 3)
    return make_tiny_target(arch, seed=3)  # gpt_oss: eager attention, additive masks, sliding layers, sinks


@pytest.fixture(scope="module", params=["llama", "qwen3", "qwen3-sliding", "gpt_oss"])
def case(request):
    """(target, prompts, Hugging Face greedy references, the oracle's pair) for one architecture."""
    model = _target(request.param)
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 250, (n,), generator=generator).tolist() for n in LENGTHS]
    with torch.no_grad():
        references = [model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                     min_new_tokens=NEW_TOKENS)[0, len(p):].tolist() for p in prompts]
    target = TargetModel(model)
    return target, (target, make_tiny_drafter(model.config, block_size=4), prompts, references)


def decode_joining(target, pair) -> tuple[dict[int, list[int]], set[tuple[int, int]]]:
    """Every request's tokens through a scheduler whose batch requests join and leave (ragged acceptance from the
    oracle drafter, rows finishing at different steps); and the (live rows, bucket) pairs the static forwards ran."""
    _, _, prompts, _ = pair
    drafter = oracle_for(pair, 4, [i for step in sorted(ARRIVALS) for i in ARRIVALS[step]])
    scheduler = Scheduler(target, drafter, 4, SchedulerLimits(max_batch_size=4, prefill_chunk_tokens=16),
                          FixedBlockSize(4))
    tokens: dict[int, list[int]] = {}
    shapes: set[tuple[int, int]] = set()
    step = 0
    while step <= max(ARRIVALS) or scheduler.has_unfinished:
        for i in ARRIVALS.get(step, []):
            scheduler.add_request(prompts[i], SamplingParams(max_new_tokens=NEW_TOKENS - 3 * (i % 3)), request_id=i)
        running = scheduler.running
        for out in scheduler.step():
            tokens.setdefault(out.index, []).extend(out.new_token_ids)
        if running is not None and isinstance(running.cache, StaticKVCache):
            shapes |= {(len(running), key[0]) for key in running.cache.forwards}
        step += 1
        assert step < 300
    return tokens, shapes


def expected_tokens(pair) -> dict[int, list[int]]:
    _, _, prompts, references = pair
    return {i: references[i][:NEW_TOKENS - 3 * (i % 3)] for i in range(len(prompts))}


def test_the_static_verify_emits_hugging_faces_greedy_tokens_with_rows_joining_and_leaving(case):
    target, pair = case
    verifier = GraphedVerifier(target, graphs=False)
    assert not verifier.use_graphs and verifier.blockers == []
    tokens, shapes = decode_joining(verifier, pair)
    eager_tokens, eager_shapes = decode_joining(target, pair)  # the eager verify over a BatchKVCache
    assert tokens == eager_tokens == expected_tokens(pair) and not eager_shapes
    assert {bucket for _, bucket in shapes} >= {2, 4} and any(rows < bucket for rows, bucket in shapes)  # padded


def test_a_wrong_position_index_changes_the_tokens(case, monkeypatch):
    target, pair = case
    load = StaticForward.load

    def shifted(self, token_ids, position_ids):
        load(self, token_ids, position_ids)
        self.positions[0] -= 1  # row 0 one slot short: it overwrites its last committed token's keys and values

    monkeypatch.setattr(StaticForward, "load", shifted)
    tokens, _ = decode_joining(GraphedVerifier(target, graphs=False), pair)
    assert tokens != expected_tokens(pair)


def test_a_stale_mask_row_changes_the_tokens(case, monkeypatch):
    target, pair = case
    refresh = StaticForward.refresh_masks

    def once(self):  # masks computed at a forward's first run only, then left as they were
        if not getattr(self, "refreshed", False):
            refresh(self)
            self.refreshed = True

    monkeypatch.setattr(StaticForward, "refresh_masks", once)
    tokens, _ = decode_joining(GraphedVerifier(target, graphs=False), pair)
    assert tokens != expected_tokens(pair)


# -- masks and positions, without a model ---------------------------------------------------------------------
HEADS, DIM, LAYERS = 2, 3, 2


def static_cache(lengths: list[int], spec: MaskSpec, capacity_limit: int = 32) -> StaticKVCache:
    width = max(lengths)
    keys = [torch.randn(len(lengths), HEADS, width, DIM) for _ in range(LAYERS)]
    return StaticKVCache.from_left_padded(keys, [k + 1 for k in keys], torch.tensor(lengths), spec, capacity_limit)


@pytest.mark.parametrize("spec", [MaskSpec(None, False, False, torch.float32), MaskSpec(4, True, False, torch.float32),
                                  MaskSpec(4, True, True, torch.bfloat16)], ids=["causal", "sliding", "additive"])
def test_masks_cover_the_whole_capacity_per_row_and_padded_rows_see_only_their_block(spec):
    lengths = [3, 6, 2]
    cache = static_cache(lengths, spec)
    cache.prepare(3)
    assert cache.allocated_rows == 4  # the bucket of 3 rows
    eager = BatchKVCache.from_left_padded([k[:3] for k in cache.keys], [v[:3] for v in cache.values],
                                          torch.tensor(lengths), spec, 32)
    eager_masks = eager.prepare(3)
    eager_masks = eager_masks if spec.as_mapping else {"full_attention": eager_masks}
    step = StaticForward(None, cache, 4, 3, ())
    step.load(torch.zeros(3, 3, dtype=torch.long), cache.lengths[:, None] + torch.arange(3)[None, :])
    step.refresh_masks()
    assert step.positions[3].tolist() == [0, 1, 2]
    for kind, mask in step.masks.items():
        assert mask.shape == (4, 1, 3, cache.capacity)
        width = eager_masks[kind].shape[-1]
        assert torch.equal(mask[:3, :, :, :width], eager_masks[kind]), kind
        allowed = step.allowed[kind]
        assert not allowed[:3, :, :, width:].any()  # beyond the longest row: never seen
        assert allowed[3, 0].tolist() == [[s <= t for s in range(cache.capacity)] for t in range(3)]
    # the next step's positions move every row's mask, in the same buffers
    buffers = [m.data_ptr() for m in step.masks.values()]
    step.load(torch.zeros(3, 3, dtype=torch.long), cache.lengths[:, None] + 1 + torch.arange(3)[None, :])
    step.refresh_masks()
    assert [m.data_ptr() for m in step.masks.values()] == buffers
    row0 = step.allowed["full_attention"][0, 0, 0]  # length 3, now at position 4: slots 0 .. 4
    assert row0[:5].all() and not row0[5:].any()


def test_rows_are_allocated_in_buckets_and_moved_buffers_drop_the_static_forwards():
    cache = static_cache([3, 5, 1], MaskSpec(None, False, False, torch.float32), capacity_limit=40)
    cache.prepare(2)
    cache.forwards[(4, 2, ())] = "a forward on the current buffers"
    capacity = cache.capacity
    cache.set_lengths(cache.lengths + 2)
    cache.prepare(2)
    assert cache.forwards and cache.capacity == capacity  # room left: nothing moved
    cache.set_lengths(torch.tensor([capacity - 1, 7, 3]))
    cache.prepare(2)  # row 0 needs more than the capacity: the buffers grow
    assert cache.capacity > capacity and cache.forwards == {} and cache.allocated_rows == 4
    cache.merge(static_cache([2, 2], MaskSpec(None, False, False, torch.float32)))
    assert cache.allocated_rows == 8  # 5 rows: the bucket of 8


# -- one forward, against the eager verify --------------------------------------------------------------------
def test_one_static_forward_gives_the_eager_verifys_logits_features_and_cache():
    model = make_tiny_target("qwen3", seed=1, use_sliding_window=True, sliding_window=8,
                             layer_types=["sliding_attention", "full_attention"] * 3)
    target = TargetModel(model)
    verifier = GraphedVerifier(target, graphs=False)
    lengths = torch.tensor([5, 12, 9])
    width = int(lengths.max())
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 250, (3, width), generator=generator)
    mask = torch.arange(width)[None, :] >= (width - lengths)[:, None]
    positions = (torch.cumsum(mask.long(), dim=1) - 1).clamp(min=0)
    caches = {}
    for name, owner in (("eager", target), ("static", verifier)):
        prefill = target.new_cache()
        target.forward(tokens, positions, mask.long(), prefill, last_only=True)
        caches[name] = owner.batch_cache(prefill, lengths, 40)
    assert isinstance(caches["static"], StaticKVCache) and type(caches["eager"]) is BatchKVCache
    block = torch.randint(0, 250, (3, 4), generator=generator)
    block_positions = lengths[:, None] + torch.arange(4)[None, :]
    layer_ids = (1, 4)
    eager = target.forward(block, block_positions, caches["eager"].prepare(4), caches["eager"], layer_ids)
    assert caches["static"].prepare(4) is None
    static = verifier.forward(block, block_positions, None, caches["static"], layer_ids)
    assert static.logits.shape == eager.logits.shape == (3, 4, 256)
    torch.testing.assert_close(static.logits, eager.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(static.features, eager.features, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(static.logits.argmax(-1), eager.logits.argmax(-1), rtol=0, atol=0)
    for layer in range(target.num_layers):
        for name in ("keys", "values"):
            ours, theirs = getattr(caches["static"], name)[layer], getattr(caches["eager"], name)[layer]
            for row, length in enumerate((lengths + 4).tolist()):
                torch.testing.assert_close(ours[row, :, :length], theirs[row, :, :length], rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="GraphedVerifier"):
        target.forward(block, block_positions, None, caches["static"], layer_ids)
    with pytest.raises(RuntimeError, match=r"prepare\(4\) must precede each forward"):  # used up by the last one
        verifier.forward(block, block_positions, None, caches["static"], layer_ids)


# -- what cannot be captured ----------------------------------------------------------------------------------
def test_capture_blockers_name_eager_experts_and_host_read_rope():
    assert capture_blockers(make_tiny_target("llama")) == []
    dynamic = make_tiny_target("llama", rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})
    assert capture_blockers(dynamic) == ["dynamic RoPE reads the largest position on the host"]
    experts = make_tiny_target("gpt_oss")
    assert capture_blockers(experts) == []  # transformers' grouped_mm experts: no host read
    experts.config._experts_implementation = "eager"
    assert "nonzero" in capture_blockers(experts)[0]
    with pytest.raises(CompatibilityError, match="cannot be captured in CUDA graphs: eager mixture-of-experts"):
        GraphedVerifier(TargetModel(experts), graphs=True)
    assert GraphedVerifier(TargetModel(experts)).use_graphs is False


def host_reads_of_a_static_forward(model) -> list[str]:
    target = TargetModel(model)
    verifier = GraphedVerifier(target, graphs=False)
    lengths = torch.tensor([5, 9, 3])
    tokens = torch.randint(0, 250, (3, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.arange(9)[None, :] >= (9 - lengths)[:, None]
    prefill = target.new_cache()
    target.forward(tokens, (torch.cumsum(mask.long(), 1) - 1).clamp(min=0), mask.long(), prefill, last_only=True)
    cache = verifier.batch_cache(prefill, lengths, 40)
    cache.prepare(4)
    step = StaticForward(verifier, cache, 4, 4, (1, 3))
    step.load(tokens[:, :4], lengths[:, None] + torch.arange(4)[None, :])
    with torch.inference_mode(), HostReads() as reads:
        step.run(cache)
    return reads.seen


@pytest.mark.parametrize("arch", ["llama", "qwen3-sliding", "gpt_oss"])
def test_a_static_forward_reads_no_tensor_on_the_host(arch):
    """Hugging Face's code path under the static forward (explicit masks, the batch cache, grouped SDPA, eager
    attention with sinks, grouped_mm experts) is capture-safe: not one host read."""
    assert host_reads_of_a_static_forward(_target(arch)) == []


def test_the_capture_blockers_are_the_host_reads():
    experts = make_tiny_target("gpt_oss")
    experts.config._experts_implementation = "eager"
    assert "nonzero" in host_reads_of_a_static_forward(experts)
    dynamic = make_tiny_target("llama", rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})
    assert "__bool__" in host_reads_of_a_static_forward(dynamic)


def test_a_cache_that_ran_static_forwards_is_freed_as_soon_as_it_is_dropped():
    """A prefilled group's cache is dropped when the group joins the running batch: its buffers must go then, not
    at some later garbage collection (no cycle between a cache and its forwards)."""
    import gc
    import weakref

    target = TargetModel(make_tiny_target("llama"))
    verifier = GraphedVerifier(target, graphs=False)
    prefill = target.new_cache()
    target.forward(torch.tensor([[1, 2, 3]]), torch.tensor([[0, 1, 2]]), torch.ones(1, 3, dtype=torch.long), prefill)
    cache = verifier.batch_cache(prefill, torch.tensor([3]), 16)
    cache.prepare(2)
    verifier.forward(torch.tensor([[4, 5]]), torch.tensor([[3, 4]]), None, cache, (1,))
    assert cache.forwards
    alive = weakref.ref(cache)
    gc.disable()
    try:
        del cache
        assert alive() is None
    finally:
        gc.enable()
