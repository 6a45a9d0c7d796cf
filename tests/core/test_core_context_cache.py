"""The drafter's context cache keeps every sequence's rows through the batch's reshaping (rows leaving, groups
joining, capacity released) while moving only what must move, and allocates nothing until a forward reads it."""

from types import SimpleNamespace

import torch

from dflash_trt.decoding.model.context_cache import ContextCache
from dflash_trt.decoding.step.batch import fill_from_the_end

CONFIG = SimpleNamespace(layer_windows=[None, 5], num_key_value_heads=2, head_dim=3)  # a full and a sliding layer


def _write(cache: ContextCache, counts: list[int], generator: torch.Generator, expected: list[list[torch.Tensor]]):
    """What a draft forward does to the cache: append counts[b] context rows to sequence b (a sliding layer keeps
    the newest window - 1), recording them in `expected` [sequence][layer] too."""
    for layer, (keys, values, window) in enumerate(zip(cache.k, cache.v, CONFIG.layer_windows)):
        for b, count in enumerate(counts):
            new = torch.randn(2, count, 3, generator=generator)
            rows = torch.cat((expected[b][layer], new), dim=1)
            if window is not None:
                rows = rows[:, -(window - 1):]
            assert rows.shape[1] <= keys.shape[2], "the context outgrew the cache's capacity"
            expected[b][layer] = rows
            keys[b, :, :rows.shape[1]] = rows
            values[b, :, :rows.shape[1]] = -rows
    cache.lens = cache.lens + torch.tensor(counts)


def _check(cache: ContextCache, expected: list[list[torch.Tensor]]):
    assert cache.size == len(expected)
    for b, layers in enumerate(expected):
        for layer, rows in enumerate(layers):
            kept = rows.shape[1]
            assert torch.equal(cache.k[layer][b, :, :kept], rows)
            assert torch.equal(cache.v[layer][b, :, :kept], -rows)
        assert int(cache.lens[b]) >= layers[0].shape[1]


def test_rows_survive_leaving_joining_and_shrinking():
    generator = torch.Generator().manual_seed(0)
    cache = ContextCache(CONFIG, 3, 40, torch.float32)
    expected = [[torch.zeros(2, 0, 3), torch.zeros(2, 0, 3)] for _ in range(3)]
    for step in range(30):
        counts = torch.randint(1, 3, (cache.size,), generator=generator).tolist()
        _write(cache, counts, generator, expected)
        if step % 4 == 1 and cache.size > 1:  # one row leaves, the last one takes its place
            leaving = int(torch.randint(0, cache.size, (1,), generator=generator))
            order = fill_from_the_end([r for r in range(cache.size) if r != leaving])
            cache.select(torch.tensor(order))
            expected = [expected[r] for r in order]
        if step % 5 == 2:  # a group joins: drafted already (its prompt taken in) or not yet read by a forward
            group = ContextCache(CONFIG, 2, 40 + step, torch.float32)
            joined = [[torch.zeros(2, 0, 3), torch.zeros(2, 0, 3)] for _ in range(2)]
            if step % 2:
                _write(group, [4, 7], generator, joined)
            cache.concat(group)
            expected += joined
        if step % 7 == 6:
            cache.shrink(int(cache.lens.max()) + 5)
        _check(cache, expected)


def test_a_batch_that_never_drafts_allocates_nothing():
    cache = ContextCache(CONFIG, 2, 64, torch.float32)
    cache.concat(ContextCache(CONFIG, 3, 80, torch.float32))
    cache.select(torch.tensor([0, 4, 2]))
    cache.shrink(70)
    assert cache.allocated_rows == 0 and cache.capacity == 70 and cache.size == 3
    assert [t.shape for t in cache.k] == [(3, 2, 70, 3), (3, 2, 4, 3)]  # allocated on first read, zeros
    assert not any(t.any() for t in cache.k + cache.v)


def test_leaving_and_joining_move_only_the_rows_that_must_move():
    generator = torch.Generator().manual_seed(1)
    cache = ContextCache(CONFIG, 4, 32, torch.float32)
    expected = [[torch.zeros(2, 0, 3), torch.zeros(2, 0, 3)] for _ in range(4)]
    _write(cache, [3, 5, 2, 4], generator, expected)
    buffers = [t.data_ptr() for t in cache.k + cache.v]
    cache.select(torch.tensor([0, 3, 2]))  # row 1 leaves; row 3 takes its place, the buffers stay
    expected = [expected[0], expected[3], expected[2]]
    assert [t.data_ptr() for t in cache.k + cache.v] == buffers
    cache.concat(ContextCache(CONFIG, 1, 32, torch.float32))  # into the spare row
    expected.append([torch.zeros(2, 0, 3), torch.zeros(2, 0, 3)])
    assert [t.data_ptr() for t in cache.k + cache.v] == buffers
    _check(cache, expected)
    assert not cache.k[0][3].any()  # the left row's stale context does not reach the newcomer
