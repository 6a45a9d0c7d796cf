"""Real servers behind a router: the prefix cache's hit rate across replicas, with and without session affinity.

    python -m dflash_trt.benchmarks.affinity [--engine engines/smollm2-135m] [--servers 2] [--conversations 12]

Each replica holds its own prefix cache, so a conversation whose turns land on different replicas misses the cache
that holds its history. This renders the engine's Triton repository once, then for each routing starts `--servers`
tritonservers on loopback (fresh caches) and replays the same multi-turn conversations (data/prompts/
sharegpt-multiturn) through them:
- affinity: every turn of a conversation goes to one replica (the conversation's number modulo the replicas:
  what the chart's `service.sessionAffinity: ClientIP` gives a client that keeps its conversation on one
  connection, or a router keyed on a session id);
- random: each turn goes to a replica drawn at random (seeded), as a Service without affinity spreads requests.
`--concurrency` conversations are in flight at once, each waiting for an answer before its next turn. A turn's
prompt is the chat template over the earlier user turns, the answers the server gave, and the new user turn, sent
as text (the repository's chat template is "none": the client formats, as a chat client resending its history
does). Per routing: the hit rate of turns 2+ (the servers' num_cached_tokens over those turns' prompt tokens) and
their TTFT p50. Writes OUT/affinity.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from contextlib import ExitStack
from pathlib import Path

ROUTINGS = ("affinity", "random")


def replay_served(grpc_urls: list[str], tokenizer, conversations, routing: str, concurrency: int,
                  max_tokens: int, seed: int = 0) -> list[dict]:
    """Every turn of every conversation through the servers; one record per turn."""
    from dflash_trt.serving.client import GrpcStream

    draw = random.Random(seed)
    draw_lock, records_lock = threading.Lock(), threading.Lock()
    records: list[dict] = []
    pending = list(enumerate(conversations))

    def converse(index: int, conversation) -> None:
        messages: list[dict] = []
        for turn, user in enumerate(conversation.user_turns, start=1):
            if routing == "affinity":
                replica = index % len(grpc_urls)
            else:
                with draw_lock:
                    replica = draw.randrange(len(grpc_urls))
            messages.append({"role": "user", "content": user})
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            stream = GrpcStream(grpc_urls[replica])
            sent, first, pieces, last = time.perf_counter(), None, [], {}
            try:
                for chunk in stream.chunks(prompt, max_tokens, temperature=0.0):
                    first = first or time.perf_counter()
                    pieces.append(chunk.get("text_output", ""))
                    last = chunk
            finally:
                stream.close()
            messages.append({"role": "assistant", "content": "".join(pieces)})
            with records_lock:
                # The prompt's tokens as the server's preprocessing counts them (tokenizer.encode of the text).
                records.append({"conversation": index, "turn": turn, "replica": replica,
                                "context_tokens": len(tokenizer.encode(prompt)),
                                "cached_tokens": int(last.get("num_cached_tokens", 0)),
                                "ttft_s": (first or time.perf_counter()) - sent})

    def worker() -> None:
        while True:
            with records_lock:
                if not pending:
                    return
                index, conversation = pending.pop(0)
            converse(index, conversation)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return records


def summarize(records: list[dict]) -> dict:
    later = [r for r in records if r["turn"] > 1]
    context = sum(r["context_tokens"] for r in later)
    return {"turns": len(records), "later_turns": len(later),
            "hit_rate_later_turns": sum(r["cached_tokens"] for r in later) / context if context else 0.0,
            "hit_rate_all_turns": sum(r["cached_tokens"] for r in records) / max(1, sum(r["context_tokens"]
                                                                                       for r in records)),
            "ttft_ms_later_turns_p50": 1e3 * statistics.median(r["ttft_s"] for r in later) if later else None}


def main(argv: list[str] | None = None) -> int:
    from dflash_trt.benchmarks.config import BenchConfig
    from dflash_trt.benchmarks.multi_turn import load_conversations
    from dflash_trt.decoding.model.target import load_tokenizer
    from dflash_trt.engine import load_engine
    from dflash_trt.serving.repo import RepoConfig, render_repository
    from dflash_trt.serving.server import serve_on_free_ports

    d = BenchConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", type=Path, default=d.engine, help="engine directory (default: %(default)s)")
    parser.add_argument("--prompts-dir", type=Path, default=d.prompts_dir, help="(default: %(default)s)")
    parser.add_argument("--servers", type=int, default=2, help="replicas (default: 2)")
    parser.add_argument("--conversations", type=int, default=12, help="(default: 12)")
    parser.add_argument("--concurrency", type=int, default=2, help="conversations in flight (default: 2)")
    parser.add_argument("--max-tokens", type=int, default=48, help="new tokens per turn (default: 48)")
    parser.add_argument("--out", type=Path, default=Path("out/affinity"))
    args = parser.parse_args(argv)

    engine = load_engine(args.engine, load_models=False)
    tokenizer = load_tokenizer(engine.target_path)
    conversations = load_conversations(args.prompts_dir, args.conversations)
    args.out.mkdir(parents=True, exist_ok=True)
    repo = render_repository(RepoConfig(engine_dir=args.engine, out=args.out / "repository",
                                        max_queue_size=4 * args.concurrency))
    results: dict = {"servers": args.servers, "conversations": len(conversations), "concurrency": args.concurrency,
                     "max_tokens": args.max_tokens, "routings": {}}
    for routing in ROUTINGS:
        print(f"[affinity] {routing}: starting {args.servers} tritonservers (fresh caches)", flush=True)
        with ExitStack() as stack:
            servers = [stack.enter_context(serve_on_free_ports(repo, log_path=args.out / f"triton-{routing}-{i}.log"))
                       for i in range(args.servers)]
            records = replay_served([s.config.grpc_url for s in servers], tokenizer, conversations, routing,
                                    args.concurrency, args.max_tokens)
        summary = summarize(records)
        results["routings"][routing] = {**summary, "records": records}
        print(f"[affinity] {args.servers} servers, {routing:>8}: hit rate of turns 2+ "
              f"{100 * summary['hit_rate_later_turns']:.0f}% (all turns {100 * summary['hit_rate_all_turns']:.0f}%), "
              f"TTFT p50 of turns 2+ {summary['ttft_ms_later_turns_p50']:.0f} ms, {summary['turns']} turns", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "affinity.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
