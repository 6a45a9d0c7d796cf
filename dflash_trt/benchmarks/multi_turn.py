"""The multi-turn scenario of `make bench`: chat conversations replayed turn by turn, with and without the prefix cache.

Each conversation of a multi-turn prompt set (data/prompts/sharegpt-multiturn) keeps its user turns and drops the
recorded answers: turn k's prompt is the chat template over the earlier user turns, the model's OWN answers to
them, and user turn k, as a chat client resends it. A user waits for an answer before sending the next turn, so
`concurrency` conversations are in flight at once, each with one outstanding turn; a finished conversation is
replaced by the next one.

One Scheduler (the in-flight batching of the served models) runs every level twice in the same process: without a
prefix cache and with one of `prefix_cache_bytes`, each starting cold. Every step verifies the engine's block size
(FixedBlockSize), so acceptance lengths do not depend on which requests share a step, and the two runs must agree
token for token and step for step. Per run: TTFT p50/p99 of first turns and of later turns (time from submitting
a turn to its first token), output tok/s over the run, tau, the hit rate (prompt tokens served from the cache /
prompt tokens looked up) and the cache's peak bytes, checked against its budget.
"""

from __future__ import annotations

import random
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from dflash_trt.benchmarks.in_process import load_prompts
from dflash_trt.decoding.model.tokens import encode_prompt
from dflash_trt.decoding.scheduler.block_policy import FixedBlockSize
from dflash_trt.decoding.scheduler.prefix_cache import PrefixCache
from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.errors import DFlashError

MULTI_TURN_FAMILY = "sharegpt-multiturn"
ROUTINGS = ("affinity", "random")


@dataclass
class Conversation:
    """The user turns of one recorded conversation, in order (its recorded answers are not replayed)."""

    user_turns: list[str]


@dataclass
class TurnRecord:
    """One served turn: which conversation and turn, its prompt, what it produced and when."""

    conversation: int
    turn: int  # 1-based
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    token_ids: list[int]
    acceptance_lengths: list[int]
    tau: float


@dataclass
class ReplayRun:
    """Every turn of one replay (one concurrency level, cache on or off)."""

    concurrency: int
    cache_bytes_budget: int  # 0: no cache
    turns: list[TurnRecord] = field(default_factory=list)
    wall_s: float = 0.0
    peak_cache_bytes: int = 0  # target KV and drafter features
    peak_cache_kv_bytes: int = 0  # of which the target KV (what the budget bounds)

    def summary(self) -> dict:
        first = [t.ttft_s for t in self.turns if t.turn == 1]
        later = [t.ttft_s for t in self.turns if t.turn >= 2]
        prompt_tokens = sum(t.prompt_tokens for t in self.turns)
        later_prompt_tokens = sum(t.prompt_tokens for t in self.turns if t.turn >= 2)
        output_tokens = sum(len(t.token_ids) for t in self.turns)
        steps = [t.tau for t in self.turns if t.acceptance_lengths]
        return {
            "num_turns": len(self.turns),
            "ttft_ms_first_turn": _percentiles(first),
            "ttft_ms_later_turns": _percentiles(later),
            "output_tokens_per_s": output_tokens / self.wall_s if self.wall_s else 0.0,
            "num_output_tokens": output_tokens,
            "tau": statistics.fmean(steps) if steps else 0.0,
            "hit_rate": sum(t.cached_tokens for t in self.turns) / prompt_tokens if prompt_tokens else 0.0,
            "hit_rate_later_turns": (sum(t.cached_tokens for t in self.turns if t.turn >= 2) / later_prompt_tokens
                                     if later_prompt_tokens else 0.0),
            "prompt_tokens": prompt_tokens,
            "cache_bytes_budget": self.cache_bytes_budget,
            "peak_cache_bytes": self.peak_cache_bytes,
            "peak_cache_kv_bytes": self.peak_cache_kv_bytes,
            "within_budget": self.peak_cache_kv_bytes <= self.cache_bytes_budget if self.cache_bytes_budget else True,
            "wall_s": self.wall_s,
        }


def load_conversations(prompts_dir: Path, num_conversations: int, family: str = MULTI_TURN_FAMILY
                       ) -> list[Conversation]:
    """The first num_conversations held-out conversations of a multi-turn prompt set, as their user turns."""
    path = Path(prompts_dir) / family / "heldout.jsonl"
    if not path.is_file():
        raise DFlashError(f"{path}: no multi-turn conversations (turn the scenario off with --no-multi-turn)")
    conversations = []
    for record in load_prompts(path):
        messages = record.prompt if isinstance(record.prompt, list) else [{"role": "user", "content": record.prompt}]
        users = [m["content"] for m in messages if m.get("role") == "user"]
        if users:
            conversations.append(Conversation(users))
        if len(conversations) == num_conversations:
            break
    return conversations


def replay(target, drafter, conversations: list[Conversation], params: SamplingParams, block_size: int,
           concurrency: int, prefix_cache_bytes: int, max_turns: int = 0, replicas: int = 1,
           routing: str = "affinity") -> ReplayRun:
    """Serve every conversation turn by turn, `concurrency` conversations at once. prefix_cache_bytes 0: no prefix
    cache. max_turns 0: every user turn of each conversation.

    replicas > 1: that many Schedulers, each with its own cache, stand for the pods behind a Service; routing
    "affinity" sends every turn of a conversation to one replica (session affinity), "random" sends each turn to
    a replica drawn at random (seeded), as a Service without affinity spreads requests."""
    if concurrency < 1 or replicas < 1:
        raise DFlashError(f"multi-turn concurrency and replicas must be >= 1, got {concurrency} and {replicas}")
    if routing not in ROUTINGS:
        raise DFlashError(f"multi-turn routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    caches = [PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None for _ in range(replicas)]
    schedulers = [Scheduler(target, drafter, block_size, SchedulerLimits(max_batch_size=concurrency),
                            FixedBlockSize(block_size), prefix_cache=cache) for cache in caches]
    draw = random.Random(0)
    run = ReplayRun(concurrency, prefix_cache_bytes)
    histories: dict[int, list[dict]] = {}
    # (replica, request id) -> conversation, turn, prompt tokens, sent at, [TTFT once the first token came]
    in_flight: dict[tuple[int, object], tuple[int, int, int, float, list]] = {}
    queue = deque(range(len(conversations)))

    def send(index: int, turn: int) -> None:
        user = {"role": "user", "content": conversations[index].user_turns[turn - 1]}
        histories[index] = histories.get(index, []) + [user]
        prompt = encode_prompt(target, histories[index], chat=True)
        replica = index % replicas if routing == "affinity" else draw.randrange(replicas)
        request_id = schedulers[replica].add_request(prompt, params)
        in_flight[replica, request_id] = (index, turn, len(prompt), time.perf_counter(), [])

    started = time.perf_counter()
    while queue and len(in_flight) < concurrency:
        send(queue.popleft(), 1)
    while any(scheduler.has_unfinished for scheduler in schedulers):
        for replica, scheduler in enumerate(schedulers):
            if not scheduler.has_unfinished:
                continue
            outputs = scheduler.step()
            now = time.perf_counter()
            # Each replica's cache has its own budget: the peak is that of the fullest one.
            run.peak_cache_bytes = max([run.peak_cache_bytes] + [cache.bytes for cache in caches if cache])
            run.peak_cache_kv_bytes = max([run.peak_cache_kv_bytes] + [cache.kv_bytes for cache in caches if cache])
            for out in outputs:
                index, turn, prompt_tokens, sent_at, first = in_flight[replica, out.index]
                if not first:
                    first.append(now - sent_at)
                if not out.is_final:
                    continue
                del in_flight[replica, out.index]
                result = out.result
                run.turns.append(TurnRecord(index, turn, prompt_tokens, result.num_cached_tokens, first[0],
                                            list(result.token_ids), list(result.acceptance_lengths), result.tau))
                answer = target.tokenizer.decode(result.token_ids, skip_special_tokens=True)
                histories[index] = histories[index] + [{"role": "assistant", "content": answer}]
                turns = len(conversations[index].user_turns)
                if turn < (min(turns, max_turns) if max_turns else turns):
                    send(index, turn + 1)
                elif queue:
                    send(queue.popleft(), 1)
    run.wall_s = time.perf_counter() - started
    run.turns.sort(key=lambda t: (t.conversation, t.turn))
    return run


def compare(uncached: ReplayRun, cached: ReplayRun) -> dict:
    """Output and acceptance differences between the two runs, turn by turn, and the TTFT ratios."""
    pairs = list(zip(uncached.turns, cached.turns))
    if len(uncached.turns) != len(cached.turns) or any((a.conversation, a.turn) != (b.conversation, b.turn)
                                                      for a, b in pairs):
        raise DFlashError("multi-turn: the cached and uncached runs served different turns")
    off, on = uncached.summary(), cached.summary()
    return {
        "output_differences": sum(a.token_ids != b.token_ids for a, b in pairs),
        "acceptance_differences": sum(a.acceptance_lengths != b.acceptance_lengths for a, b in pairs),
        "ttft_p50_speedup_later_turns": _ratio(off["ttft_ms_later_turns"]["p50"], on["ttft_ms_later_turns"]["p50"]),
        "ttft_p50_speedup_first_turn": _ratio(off["ttft_ms_first_turn"]["p50"], on["ttft_ms_first_turn"]["p50"]),
    }


def run_multi_turn(target, drafter, conversations: list[Conversation], params: SamplingParams, block_size: int,
                   levels: tuple[int, ...], prefix_cache_bytes: int, max_turns: int = 0, log=print) -> dict:
    """Every concurrency level without and with the cache (alternating which goes first); the summary dict."""
    if prefix_cache_bytes < 1:
        raise DFlashError(f"the multi-turn scenario compares with a cache: prefix_cache_bytes must be >= 1, "
                          f"got {prefix_cache_bytes}")
    # Warm-up: the first forward of a process pays for allocations and kernel selection.
    warmup = SamplingParams(max_new_tokens=min(8, params.max_new_tokens), stop_token_ids=params.stop_token_ids)
    replay(target, drafter, conversations[:1], warmup, block_size, 1, 0, max_turns=1)
    out: dict = {"num_conversations": len(conversations), "block_size": block_size,
                 "prefix_cache_bytes": prefix_cache_bytes, "levels": {}}
    for position, level in enumerate(levels):
        runs = {}
        for budget in ((0, prefix_cache_bytes) if position % 2 == 0 else (prefix_cache_bytes, 0)):
            name = "cache" if budget else "no_cache"
            log(f"multi-turn: {len(conversations)} conversations, concurrency {level}, {name.replace('_', ' ')}")
            runs[name] = replay(target, drafter, conversations, params, block_size, level, budget, max_turns)
        out["levels"][str(level)] = {"no_cache": runs["no_cache"].summary(), "cache": runs["cache"].summary(),
                                     **compare(runs["no_cache"], runs["cache"])}
    return out


def format_multi_turn(multi_turn: dict) -> list[str]:
    """The scenario as fixed-width lines for the printed report."""
    lines = [f"Multi-turn: {multi_turn['num_conversations']} conversations replayed turn by turn (own answers), "
             f"block {multi_turn['block_size']}, prefix cache {multi_turn['prefix_cache_bytes'] / 2**20:.0f} MiB "
             f"vs none, same run",
             f"{'conc':>5}{'cache':>7}{'TTFT turn 1 p50/p99':>21}{'TTFT turns 2+ p50/p99':>23}{'tok/s':>8}"
             f"{'tau':>6}{'hit rate':>10}{'peak MiB':>10}"]
    for level, data in multi_turn["levels"].items():
        for name in ("no_cache", "cache"):
            r = data[name]
            lines.append(f"{level:>5}{'on' if name == 'cache' else 'off':>7}{_pair(r['ttft_ms_first_turn']):>21}"
                         f"{_pair(r['ttft_ms_later_turns']):>23}{r['output_tokens_per_s']:>8.1f}{r['tau']:>6.2f}"
                         f"{100 * r['hit_rate']:>9.0f}%{r['peak_cache_bytes'] / 2**20:>10.1f}")
        speedup = data["ttft_p50_speedup_later_turns"]
        lines.append(f"{'':>5} turns 2+ TTFT p50 {'-' if speedup is None else f'{speedup:.2f}x'} lower with the cache; "
                     f"output differences {data['output_differences']}, acceptance differences "
                     f"{data['acceptance_differences']}, within budget: "
                     f"{'yes' if data['cache']['within_budget'] else 'NO'}")
    return lines


def _percentiles(seconds: list[float]) -> dict:
    if not seconds:
        return {"p50": None, "p99": None}
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50": 1e3 * statistics.median(ordered), "p99": 1e3 * p99}


def _ratio(numerator, denominator):
    return numerator / denominator if numerator and denominator else None


def _pair(values: dict) -> str:
    fmt = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    return f"{fmt(values['p50'])} / {fmt(values['p99'])}"


def main(argv: list[str] | None = None) -> int:
    """`python -m dflash_trt.benchmarks.multi_turn`: the hit rate of later turns over several replicas, with
    session affinity and with requests spread at random (docs/prefix-cache.md)."""
    import argparse

    from dflash_trt.benchmarks.config import BenchConfig
    from dflash_trt.decoding.model.tokens import default_stop_ids
    from dflash_trt.engine import load_engine

    d = BenchConfig()
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--engine", type=Path, default=d.engine, help="engine directory (default: %(default)s)")
    parser.add_argument("--prompts-dir", type=Path, default=d.prompts_dir, help="(default: %(default)s)")
    parser.add_argument("--conversations", type=int, default=d.multi_turn_conversations, help="(default: %(default)s)")
    parser.add_argument("--replicas", type=int, default=2, help="replicas, each with its own cache (default: 2)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="(default: %(default)s)")
    parser.add_argument("--prefix-cache-bytes", type=int, default=d.prefix_cache_bytes,
                        help="byte budget of each replica's cache (default: %(default)s)")
    args = parser.parse_args(argv)
    engine = load_engine(args.engine)
    conversations = load_conversations(args.prompts_dir, args.conversations)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, stop_token_ids=tuple(default_stop_ids(engine.target)))
    runs = {routing: replay(engine.target, engine.drafter, conversations, params, engine.block_size, 1,
                            args.prefix_cache_bytes, replicas=args.replicas, routing=routing)
            for routing in ROUTINGS}
    for routing, run in runs.items():
        s = run.summary()
        print(f"{args.replicas} replicas, {routing:>8}: hit rate {100 * s['hit_rate']:.0f}% "
              f"(turns 2+: {100 * s['hit_rate_later_turns']:.0f}%), TTFT turns 2+ p50 "
              f"{s['ttft_ms_later_turns']['p50']:.0f} ms")
    print(f"output differences between the two: {compare(runs['affinity'], runs['random'])['output_differences']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
