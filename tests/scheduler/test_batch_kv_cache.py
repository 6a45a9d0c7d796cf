"""The batch's target KV cache: in-place writes at each row's length, crop, growth, row select / merge, masks;
and ragged batches on targets with sliding-window layers emitting the tokens of plain decoding alone."""

from __future__ import annotations

import pytest
import torch
from conftest import oracle_for

from dflash_trt.decoding.model.kv_cache import BatchKVCache, MaskSpec, Room
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.scheduler.block_policy import FixedBlockSize
from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits
from dflash_trt.decoding.step.batch import fill_from_the_end
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.errors import CompatibilityError
from dflash_trt.testing import make_tiny_drafter, make_tiny_target

HEADS, DIM, LAYERS = 2, 3, 2
BOOL = MaskSpec(None, False, False, torch.float32)


def value(row: int, position: int, layer: int, kind: int = 0) -> float:
    return 1000.0 * row + position + 0.25 * layer + 0.125 * kind + 1.0  # never 0, the buffers' fill


def left_padded(lengths: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Prefill layers [B, H, W, D]: row b's positions 0 .. lengths[b] - 1 at the right end."""
    width = max(lengths)
    keys, values = [], []
    for layer in range(LAYERS):
        pair = []
        for kind in (0, 1):
            tensor = torch.full((len(lengths), HEADS, width, DIM), -7.0)
            for row, length in enumerate(lengths):
                for position in range(length):
                    tensor[row, :, width - length + position] = value(row, position, layer, kind)
            pair.append(tensor)
        keys.append(pair[0])
        values.append(pair[1])
    return keys, values


def make_cache(lengths: list[int], capacity_limit: int = 64, spec: MaskSpec = BOOL) -> BatchKVCache:
    keys, values = left_padded(lengths)
    return BatchKVCache.from_left_padded(keys, values, torch.tensor(lengths), spec, capacity_limit)


def row_values(cache: BatchKVCache, row: int, length: int, layer: int = 0) -> list[float]:
    return cache.keys[layer][row, 0, :length, 0].tolist()


def forward(cache: BatchKVCache, new: torch.Tensor):
    """What a decoder forward does to the cache: prepare, then update every layer with `new` [B, T]."""
    masks = cache.prepare(new.shape[1])
    states = new[:, None, :, None].expand(-1, HEADS, -1, DIM).float()
    views = [cache.update(states, states + 0.5, layer) for layer in range(LAYERS)]
    return masks, views


def test_prefilled_rows_are_left_aligned():
    cache = make_cache([3, 5, 1])
    assert cache.width == 5 and cache.capacity == 10
    for row, length in enumerate([3, 5, 1]):
        assert row_values(cache, row, length, layer=1) == [value(row, p, 1) for p in range(length)]
        assert cache.values[1][row, 0, :length, 0].tolist() == [value(row, p, 1, 1) for p in range(length)]


def test_new_tokens_are_written_in_place_at_each_rows_own_length():
    cache = make_cache([3, 5, 1])
    storage = cache.keys[0].data_ptr()
    _masks, views = forward(cache, torch.tensor([[-1, -2], [-3, -4], [-5, -6]]))
    keys, values = views[0]
    assert keys.shape == (3, HEADS, 7, DIM) and keys.data_ptr() == storage  # a view, not a copy
    assert row_values(cache, 0, 5) == [value(0, p, 0) for p in range(3)] + [-1, -2]
    assert row_values(cache, 1, 7) == [value(1, p, 0) for p in range(5)] + [-3, -4]
    assert row_values(cache, 2, 3) == [value(2, 0, 0), -5, -6]
    assert values[2, 0, :3, 0].tolist() == [value(2, 0, 0, 1), -4.5, -5.5]


def test_masks_follow_positions_per_row_causal_sliding_and_additive():
    lengths = torch.tensor([3, 6])
    for spec in (BOOL, MaskSpec(4, True, False, torch.float32), MaskSpec(4, True, True, torch.bfloat16)):
        cache = make_cache(lengths.tolist(), spec=spec)
        masks = cache.prepare(3)
        mapping = masks if spec.as_mapping else {"full_attention": masks}
        query = lengths[:, None, None] + torch.arange(3)[None, :, None]
        slot = torch.arange(9)[None, None, :]
        expected = {"full_attention": slot <= query}
        if spec.sliding_window:
            expected["sliding_attention"] = (slot <= query) & (query - slot < 4)
        assert set(mapping) == set(expected)
        for kind, mask in mapping.items():
            assert mask.shape == (2, 1, 3, 9)
            if spec.additive:
                assert mask.dtype == torch.bfloat16
                allowed = mask[:, 0] == 0
                assert bool((mask[:, 0][~allowed] == torch.finfo(torch.bfloat16).min).all())
            else:
                allowed = mask[:, 0]
            assert torch.equal(allowed, expected[kind]), kind


def test_set_lengths_crops_each_row_and_the_next_block_overwrites_the_stale_slots():
    cache = make_cache([3, 5])
    forward(cache, torch.tensor([[-1, -2, -3], [-4, -5, -6]]))
    cache.set_lengths(torch.tensor([4, 8]))  # row 0 keeps one of its three new slots, row 1 all
    assert cache.width == 8 and cache.lengths.tolist() == [4, 8]
    masks, _ = forward(cache, torch.tensor([[-7], [-8]]))
    assert row_values(cache, 0, 5) == [value(0, p, 0) for p in range(3)] + [-1, -7]
    assert row_values(cache, 1, 9) == [value(1, p, 0) for p in range(5)] + [-4, -5, -6, -8]
    assert masks[0, 0, 0].tolist() == [True] * 5 + [False] * 4  # row 0's stale slots 5..8 are masked


def test_capacity_grows_geometrically_up_to_the_limit_keeping_the_rows():
    cache = make_cache([2, 4], capacity_limit=20)
    capacities = [cache.capacity]
    for step in range(10):
        forward(cache, torch.full((2, 2), -float(step + 1)))
        cache.set_lengths(cache.lengths + 2)
        capacities.append(cache.capacity)
    assert capacities[0] == 8 and sorted(set(capacities)) == [8, 16, 20, 22, 24]  # x2, the limit, then the need
    assert row_values(cache, 0, 22) == [value(0, 0, 0), value(0, 1, 0)] + [-float(s // 2 + 1) for s in range(20)]
    assert row_values(cache, 1, 4) == [value(1, p, 0) for p in range(4)]


def test_fill_from_the_end_moves_the_fewest_rows():
    assert fill_from_the_end([0, 2, 3, 5]) == [0, 5, 2, 3]
    assert fill_from_the_end([1, 2, 3]) == [3, 1, 2]
    assert fill_from_the_end([0, 1, 2]) == [0, 1, 2]
    assert fill_from_the_end([4, 5]) == [5, 4]


def test_select_moves_rows_into_the_places_of_leaving_ones_and_release_gives_memory_back():
    lengths = [3, 1, 4, 2, 5, 2]
    cache = make_cache(lengths)
    storage = cache.keys[0].data_ptr()
    order = fill_from_the_end([0, 2, 3, 5])
    cache.select(order)
    assert cache.lengths.tolist() == [lengths[r] for r in order]
    assert cache.keys[0].data_ptr() == storage and cache.allocated_rows == 6  # moved in place
    for row, source in enumerate(order):
        assert row_values(cache, row, lengths[source]) == [value(source, p, 0) for p in range(lengths[source])]
    cache.release(64)
    assert cache.allocated_rows == 6  # 6 rows for 4: kept for newcomers
    cache.select([3, 0])
    cache.release(4)
    assert cache.allocated_rows == 2 and cache.capacity == 4  # more than twice the rows, capacity past the limit
    assert row_values(cache, 0, 2) == [value(3, p, 0) for p in range(2)]
    assert row_values(cache, 1, 3) == [value(0, p, 0) for p in range(3)]


def test_merge_writes_newcomers_into_spare_rows_or_grows():
    cache = make_cache([3, 1, 4, 2])
    cache.select([0, 2])
    storage = cache.keys[1].data_ptr()
    newcomers = make_cache([6, 2])
    cache.merge(newcomers)
    assert cache.keys[1].data_ptr() == storage  # two spare rows, capacity 8 >= 6
    assert cache.lengths.tolist() == [3, 4, 6, 2]
    assert row_values(cache, 2, 6, layer=1) == [value(0, p, 1) for p in range(6)]
    assert row_values(cache, 3, 2, layer=1) == [value(1, p, 1) for p in range(2)]
    wide = make_cache([11], capacity_limit=90)
    cache.merge(wide)
    assert cache.allocated_rows == 8 and cache.capacity >= 11 and cache.capacity_limit == 90  # rows grow x2
    assert row_values(cache, 4, 11) == [value(0, p, 0) for p in range(11)]
    assert row_values(cache, 1, 4) == [value(2, p, 0) for p in range(4)]


def test_attention_implementations_without_explicit_masks_are_refused():
    model = make_tiny_target("llama")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(CompatibilityError, match="sdpa and eager"):
        MaskSpec.from_config(model.config, torch.float32)


def _sliding_target(arch: str):
    if arch == "qwen3":  # sdpa, boolean masks
        return make_tiny_target("qwen3", seed=3, use_sliding_window=True, sliding_window=8,
                                layer_types=["sliding_attention", "full_attention"] * 3)
    return make_tiny_target("gpt_oss", seed=3)  # eager, additive masks, attention sinks


@pytest.mark.parametrize("arch", ["gpt_oss", "qwen3"])
def test_ragged_batch_with_sliding_window_layers_emits_the_tokens_of_plain_decoding_alone(arch):
    model = _sliding_target(arch)
    spec = MaskSpec.from_config(model.config, torch.float32)
    assert spec.sliding_window == 8 and spec.as_mapping and spec.additive == (arch == "gpt_oss")
    target = TargetModel(model)
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 250, (n,), generator=generator).tolist() for n in (1, 13, 4, 21, 9, 2)]
    new_tokens = 20
    with torch.no_grad():  # plain decoding alone, by Hugging Face's own loop and cache
        references = [model.generate(torch.tensor([p]), max_new_tokens=new_tokens, do_sample=False,
                                     min_new_tokens=new_tokens)[0, len(p):].tolist() for p in prompts]
    pair = (target, make_tiny_drafter(model.config, block_size=4), prompts, references)
    drafter = oracle_for(pair, 4, list(range(len(prompts))))  # ragged acceptance, rows crossing the window
    scheduler = Scheduler(target, drafter, 4, SchedulerLimits(max_batch_size=4, prefill_chunk_tokens=16),
                          FixedBlockSize(4))
    tokens, step, arrivals = {}, 0, {0: [0, 1], 3: [2], 5: [3, 4], 9: [5]}
    while step <= max(arrivals) or scheduler.has_unfinished:
        for i in arrivals.get(step, []):
            scheduler.add_request(prompts[i], SamplingParams(max_new_tokens=new_tokens - 3 * (i % 3)), request_id=i)
        for out in scheduler.step():
            tokens.setdefault(out.index, []).extend(out.new_token_ids)
        step += 1
        assert step < 500
    for i in range(len(prompts)):
        assert tokens[i] == references[i][:new_tokens - 3 * (i % 3)], f"request {i}"


@pytest.mark.parametrize("num_new", [1, 4])
def test_grouped_sdpa_attends_as_hugging_faces_sdpa_without_repeating_heads(num_new):
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from dflash_trt.decoding.model.kv_cache import grouped_sdpa

    cache = make_cache([3, 9, 5], spec=BOOL)
    mask = cache.prepare(num_new)
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(3, 6, num_new, DIM, generator=generator)
    key = torch.randn(3, HEADS, 20, DIM, generator=generator)[:, :, :9 + num_new]  # strided, as cache views are
    value = torch.randn(3, HEADS, 20, DIM, generator=generator)[:, :, :9 + num_new]
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.5)
    got, _ = grouped_sdpa(module, query, key, value, mask, scaling=0.5)
    torch.testing.assert_close(got, expected)


def test_a_batch_forward_leaves_the_targets_attention_implementation_as_it_was():
    target = TargetModel(make_tiny_target("llama"))
    scheduler = Scheduler(target, None, 1, SchedulerLimits(max_batch_size=2), FixedBlockSize(1))
    scheduler.add_request([1, 2, 3], SamplingParams(max_new_tokens=3))
    while scheduler.has_unfinished:
        scheduler.step()
    assert target.config._attn_implementation == "sdpa"


def join_one_at_a_time(cache: BatchKVCache, newcomers: int) -> int:
    """Merge `newcomers` single rows (2-4 positions each) into the cache; returns how many times it reallocated."""
    reallocations, storage = 0, cache.keys[0].data_ptr()
    for joined in range(1, newcomers + 1):
        cache.merge(make_cache([2 + joined % 3]))
        if cache.keys[0].data_ptr() != storage:
            reallocations, storage = reallocations + 1, cache.keys[0].data_ptr()
    return reallocations


def test_a_batch_filling_up_one_newcomer_at_a_time_reallocates_a_few_times_not_at_every_join():
    cache = make_cache([3])
    reallocations = join_one_at_a_time(cache, 15)
    assert len(cache) == 16 and cache.allocated_rows == 16
    assert reallocations == 4  # 1 -> 2 -> 4 -> 8 -> 16 rows
    assert row_values(cache, 0, 3) == [value(0, p, 0) for p in range(3)]
    assert row_values(cache, 15, 2) == [value(0, p, 0) for p in range(2)]


def test_release_keeps_capacity_within_twice_the_limit_and_gives_back_beyond():
    cache = make_cache([3, 30], capacity_limit=64)
    for _ in range(2):
        forward(cache, torch.zeros(2, 2))
        cache.set_lengths(cache.lengths + 2)
    assert cache.capacity == 60 and cache.width == 34
    storage = cache.keys[0].data_ptr()
    cache.release(40)  # the longest-reserving row left: 60 slots is within twice 40, nothing is copied
    assert cache.capacity == 60 and cache.keys[0].data_ptr() == storage
    cache.select([0])
    cache.release(25)  # 60 > 2 x max(25, its 7 slots): given back
    assert cache.capacity == 25 and cache.allocated_rows == 2
    assert row_values(cache, 0, 3) == [value(0, p, 0) for p in range(3)]


def test_a_planned_room_takes_a_burst_of_joins_in_one_reallocation_and_release_keeps_it():
    cache = make_cache([3])
    cache.plan_room(Room(rows=16, tokens=40))
    reallocations = join_one_at_a_time(cache, 15)
    storage = cache.keys[0].data_ptr()
    assert len(cache) == 16 and reallocations == 1
    assert (cache.allocated_rows, cache.capacity) == (16, 40)  # the planned rows and reservation, at once
    assert [row_values(cache, row, 2) for row in (0, 7, 15)] == [[value(0, p, 0) for p in range(2)]] * 3
    for _ in range(10):  # up to 3 + 30 slots: within the planned capacity, nothing moves
        forward(cache, torch.zeros(16, 3))
        cache.set_lengths(cache.lengths + 3)
    assert cache.keys[0].data_ptr() == storage
    cache.select([0, 1, 2])
    cache.release(64)  # 16 rows for 3: more than twice the batch, but the room the scheduler planned
    assert cache.allocated_rows == 16 and cache.keys[0].data_ptr() == storage
    cache.plan_room(Room(rows=3, tokens=40))  # the burst is over
    cache.release(64)
    assert cache.allocated_rows == 3 and row_values(cache, 2, 3) == [value(0, p, 0) for p in range(3)]


def test_rows_still_double_past_an_exact_plan_but_never_past_max_rows():
    cache = make_cache([3, 3])
    storages = {cache.keys[0].data_ptr()}
    for joined in range(3, 8):  # newcomers arrive one at a time: the plan is always the rows after the join
        cache.plan_room(Room(rows=joined, tokens=10, max_rows=7))
        cache.merge(make_cache([2]))
        storages.add(cache.keys[0].data_ptr())
    assert len(cache) == 7 and cache.allocated_rows == 7 and len(storages) == 3  # 2 -> 4 -> 7 rows


def test_release_keeps_the_capacity_planned_for_a_waiting_request():
    cache = make_cache([3, 3], capacity_limit=10)
    cache.plan_room(Room(rows=3, tokens=40))  # a request with a reservation of 40 slots waits
    cache.merge(make_cache([2]))
    storage = cache.keys[0].data_ptr()
    assert cache.capacity == 40
    cache.release(10)  # 40 slots is more than twice the rows' 10, not more than twice the 40 planned
    assert cache.capacity == 40 and cache.keys[0].data_ptr() == storage
    cache.plan_room(Room(rows=3, tokens=10))  # it was served elsewhere: the capacity is given back
    cache.release(10)
    assert cache.capacity == 10 and row_values(cache, 2, 2) == [value(0, p, 0) for p in range(2)]


def test_the_planned_room_stays_within_the_token_limit_but_never_below_the_rows_in_the_batch():
    cache = make_cache([3, 5], capacity_limit=20)  # capacity 10: twice the prefill's width
    cache.plan_room(Room(rows=32, tokens=10, max_tokens=100))
    cache.merge(make_cache([4]))
    assert len(cache) == 3 and (cache.allocated_rows, cache.capacity) == (10, 10)  # 10 x 10 slots, not 32 rows
    for _ in range(3):  # past 10 slots: capacity doubles to the limit, and rows give way to stay within 100
        forward(cache, torch.zeros(3, 2))
        cache.set_lengths(cache.lengths + 2)
    assert (cache.allocated_rows, cache.capacity) == (5, 20)
    assert row_values(cache, 1, 5) == [value(1, p, 0) for p in range(5)]
    cache.plan_room(Room(rows=32, tokens=10, max_tokens=10))  # a limit the batch's own rows pass: they keep room
    cache.merge(make_cache([2, 2, 2]))
    assert len(cache) == 6 and cache.allocated_rows == 6 and cache.capacity == 20


def test_a_burst_of_requests_grows_the_batchs_cache_once_and_never_past_max_batch_size():
    target = TargetModel(make_tiny_target("llama"))
    limits = SchedulerLimits(max_batch_size=10, prefill_chunk_tokens=16)  # prefilled three prompts a step
    scheduler = Scheduler(target, None, 1, limits, FixedBlockSize(1))
    for request in range(12):
        scheduler.add_request([1 + request, 2, 3, 4, 5], SamplingParams(max_new_tokens=12))
    allocations = []  # (rows allocated, capacity) of the running batch's cache at each change of its storage
    storage = None
    while scheduler.has_unfinished:
        scheduler.step()
        if scheduler.running is not None and scheduler.running.cache.keys[0].data_ptr() != storage:
            cache = scheduler.running.cache
            storage = cache.keys[0].data_ptr()
            allocations.append((cache.allocated_rows, cache.capacity))
    # The first group's prefill (3 rows, twice its 5 slots); then, as the second group joins, room for the whole
    # batch at its reservation (5 + 12 + 1 slots), which holds to the end.
    assert allocations == [(3, 10), (10, 18)]
