"""In-process throughput of the scheduler's decoding steps at fixed batch sizes.

    python -m dflash_trt.benchmarks.batch_throughput --engine engines/smollm2-135m --batch-sizes 1,4,16,32

For each batch size B and block size S: B chat prompts (each asking several held-out questions, about
--prompt-tokens tokens) are prefilled, then, once all B run, --steps decoding steps are timed;
output tok/s = tokens committed in those steps / their wall time, and per CPU second of the process (on a
shared machine the steadier of the two: it does not count the time other processes hold the cores). Requests never stop early (no stop
ids, max_new_tokens large enough), so every level decodes a full batch. Prints one JSON line per level,
with a digest of the committed tokens (equal digests: equal outputs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time


def run_level(target, drafter, prompts, batch_size: int, block_size: int, steps: int) -> dict:
    from dflash_trt.decoding.scheduler.block_policy import FixedBlockSize
    from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits
    from dflash_trt.decoding.step.sampling import SamplingParams

    scheduler = Scheduler(target, drafter if block_size > 1 else None, block_size,
                          SchedulerLimits(max_batch_size=batch_size, max_kv_tokens=None, prefill_chunk_tokens=None),
                          FixedBlockSize(block_size))
    params = SamplingParams(max_new_tokens=block_size * (steps + 4) + 8)
    for prompt in prompts[:batch_size]:
        scheduler.add_request(prompt, params)
    tokens: dict = {}

    def step() -> int:
        outputs = scheduler.step()
        for out in outputs:
            tokens.setdefault(out.index, []).extend(out.new_token_ids)
        return sum(len(out.new_token_ids) for out in outputs)

    while scheduler.num_running < batch_size:
        step()
    step()  # the first step of the full batch pays for its allocations
    start, cpu_start, committed = time.perf_counter(), time.process_time(), 0
    for _ in range(steps):
        committed += step()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    digest = hashlib.sha256(json.dumps([tokens[k] for k in sorted(tokens)]).encode()).hexdigest()[:12]
    return {"batch_size": batch_size, "block_size": block_size, "steps": steps, "tokens": committed,
            "seconds": round(elapsed, 3), "tok_per_s": round(committed / elapsed, 2),
            "cpu_seconds": round(cpu, 3), "tok_per_cpu_s": round(committed / cpu, 2),
            "context_tokens": scheduler.running.width, "tokens_digest": digest,
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def long_prompts(target, texts: list[str], count: int, prompt_tokens: int) -> list[list[int]]:
    """count chat prompts of at least prompt_tokens tokens, each a different run of the questions."""
    from dflash_trt.decoding.model.tokens import encode_prompt

    prompts = []
    for i in range(count):
        questions, j = [], i
        while len(target.tokenizer(" ".join(questions))["input_ids"]) < prompt_tokens:
            questions.append(texts[j % len(texts)])
            j += 7
        prompts.append(encode_prompt(target, "\n".join(questions), True))
    return prompts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", required=True)
    parser.add_argument("--prompts-dir", default="data/prompts")
    parser.add_argument("--families", default="chat,code,math")
    parser.add_argument("--batch-sizes", default="1,4,16,32")
    parser.add_argument("--block-sizes", default="8,1")
    parser.add_argument("--prompt-tokens", type=int, default=350)
    parser.add_argument("--steps", type=int, default=12, help="timed steps per level (block size 1: twice as many)")
    parser.add_argument("--num-threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)

    import torch

    from dflash_trt.benchmarks.in_process import load_prompts
    from dflash_trt.engine import load_engine

    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    engine = load_engine(args.engine)
    texts = [r.prompt for family in args.families.split(",")
             for r in load_prompts(f"{args.prompts_dir}/{family}/heldout.jsonl") if isinstance(r.prompt, str)]
    batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    prompts = long_prompts(engine.target, texts, max(batch_sizes), args.prompt_tokens)
    for block_size in (int(x) for x in args.block_sizes.split(",")):
        for batch_size in batch_sizes:
            steps = args.steps if block_size > 1 else 2 * args.steps
            print(json.dumps(run_level(engine.target, engine.drafter, prompts, batch_size, block_size, steps)),
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
