"""The step-by-step comparison of loaded schedulers (benchmarks/interleaved.py): turns, counting, the shared
request sequence, the output check, and one real run on a tiny random pair."""

from __future__ import annotations

from collections import Counter

import pytest

from dflash_trt.benchmarks import interleaved
from dflash_trt.benchmarks.interleaved import (CONTROL, DFLASH, PLAIN, ModeRun, request_sequence, run_level,
                                               summarize, take_turns)
from dflash_trt.decoding.step.results import StepOutput
from dflash_trt.errors import DFlashError


class FakeScheduler:
    """Commits `tokens_per_step` tokens to every running request per step; a request ends after `length` steps.
    Every step is written to the shared `order` (the turns taken)."""

    def __init__(self, name: str, order: list, tokens_per_step: int = 1, length: int = 3, clock=None,
                 step_s: float = 0.0):
        self.name, self.order, self.tokens_per_step, self.length = name, order, tokens_per_step, length
        self.clock, self.step_s = clock, step_s  # a fake clock that each step moves by step_s
        self.running: dict[int, int] = {}  # request id -> steps taken
        self.added: list = []
        self.excluded: list[float] = []
        self.policy = type("Policy", (), {"steps_run": Counter()})()

    def add_request(self, prompt, params):
        request_id = len(self.added)
        self.added.append((list(prompt), params.max_new_tokens))
        self.running[request_id] = 0
        return request_id

    def exclude_time(self, seconds):
        self.excluded.append(seconds)

    def step(self):
        self.order.append(self.name)
        if self.clock is not None:
            self.clock.now += self.step_s
        outputs = []
        for request_id in list(self.running):
            self.running[request_id] += 1
            final = self.running[request_id] >= self.length
            outputs.append(StepOutput(request_id, [request_id] * self.tokens_per_step, 1, final))
            if final:
                del self.running[request_id]
        return outputs


def _runs(order, names=(DFLASH, PLAIN), windows=2, step_s=None, **kwargs) -> dict[str, ModeRun]:
    prompts = [[1, 2], [3], [4, 5, 6]]
    runs = {}
    for name in names:
        seconds = (step_s or {}).get(name, 0.0)
        run = ModeRun(FakeScheduler(name, order, step_s=seconds, **kwargs), request_sequence(prompts, 10, 3), windows)
        for _ in range(2):
            run.add_next_request()
        runs[name] = run
    return runs


def test_modes_take_one_step_each_in_turn_in_every_order():
    order: list = []
    take_turns(_runs(order, names=(DFLASH, PLAIN)), steps=3, warmup_steps=1, windows=1)
    assert order == [DFLASH, PLAIN, PLAIN, DFLASH, DFLASH, PLAIN, PLAIN, DFLASH]
    order.clear()
    take_turns(_runs(order, names=(DFLASH, PLAIN, CONTROL)), steps=6, warmup_steps=0, windows=1)
    turns = [tuple(order[i:i + 3]) for i in range(0, 18, 3)]
    assert len(set(turns)) == 6  # every order once: each mode first, in the middle and last twice
    for mode in (DFLASH, PLAIN, CONTROL):
        assert [turn.index(mode) for turn in turns].count(1) == 2


def test_warm_up_steps_are_not_counted_and_counted_ones_fill_every_window():
    order: list = []
    runs = _runs(order, windows=4, tokens_per_step=2)
    take_turns(runs, steps=8, warmup_steps=5, windows=4)
    for run in runs.values():
        assert run.scheduler.order.count(run.scheduler.name) == 13
        assert run.tokens == 8 * 2 * 2  # 8 counted steps x 2 requests in flight x 2 tokens
        assert run.window_tokens == [8, 8, 8, 8]
        assert sum(run.window_seconds) == pytest.approx(run.seconds)


def test_every_mode_is_sent_the_same_requests_in_the_same_order():
    order: list = []
    runs = _runs(order, length=2)
    take_turns(runs, steps=9, warmup_steps=0, windows=1)
    dflash, plain = runs[DFLASH].scheduler.added, runs[PLAIN].scheduler.added
    assert len(dflash) == len(plain) > 4  # finished requests were replaced
    assert dflash == plain
    lengths = {max_tokens for _prompt, max_tokens in dflash}
    assert lengths <= set(range(7, 14)) and len(lengths) > 1  # 10 +- 3, seeded


def test_a_request_whose_tokens_differ_between_modes_is_reported():
    order: list = []
    runs = _runs(order, length=2)
    take_turns(runs, steps=6, warmup_steps=0, windows=2)
    result = summarize(runs, concurrency=2)
    assert result["identical"] and result["compared"] >= 4
    finished = sorted(runs[DFLASH].finished)[0]
    runs[DFLASH].outputs[finished] = runs[DFLASH].outputs[finished] + [99]
    assert not summarize(runs, concurrency=2)["identical"]
    # A request still running in one mode has partial outputs there: it is not compared.
    running = next(iter(runs[PLAIN].scheduler.running))
    runs2 = _runs([], length=2)
    take_turns(runs2, steps=6, warmup_steps=0, windows=2)
    runs2[DFLASH].outputs[running] = [7, 7, 7]
    runs2[DFLASH].finished.discard(running)
    assert summarize(runs2, concurrency=2)["identical"]


class _Clock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_each_mode_is_timed_by_its_own_steps_and_excludes_the_others(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(interleaved, "time", clock)
    runs = _runs([], windows=1, step_s={DFLASH: 2.0, PLAIN: 3.0}, clock=clock)
    take_turns(runs, steps=4, warmup_steps=0, windows=1)  # D P, P D, D P, P D
    assert runs[DFLASH].seconds == 8.0 and runs[PLAIN].seconds == 12.0
    # Before each step but its first, a mode tells its scheduler how long the other's steps took since its last one
    # (not its overhead): D waited for two of P's steps, for none of them (its two in a row), then for two again.
    assert runs[DFLASH].scheduler.excluded == [6.0, 0.0, 6.0]
    assert runs[PLAIN].scheduler.excluded == [0.0, 4.0, 0.0]


def test_too_few_steps_for_the_windows_are_refused():
    with pytest.raises(DFlashError, match="windows"):
        run_level(None, None, [[1]], 2, block_size=4, steps=3, warmup_steps=0, max_new_tokens=8, spread=0,
                  windows=4)


def test_a_real_run_on_a_tiny_pair_gives_plain_decodings_tokens(monkeypatch):
    from dflash_trt.decoding.model.target import TargetModel
    from dflash_trt.testing import make_tiny_drafter, make_tiny_target

    model = make_tiny_target("llama", seed=3)
    target, drafter = TargetModel(model), make_tiny_drafter(model.config, block_size=4)
    prompts = [[5, 9, 11], [40, 2], [7, 7, 7, 7, 7], [100]]
    result = run_level(target, drafter, prompts, 3, block_size=4, steps=40, warmup_steps=4, max_new_tokens=8,
                       spread=3, windows=4, plain_control=True)
    assert result["identical"] and result["compared"] >= 6
    assert set(result["tokens_per_s"]) == {DFLASH, PLAIN, CONTROL}
    assert all(tokens > 0 for tokens in result["tokens"].values())
    assert sum(result["plans"].values()) > 0
    assert "outputs of" in interleaved.describe(result)
