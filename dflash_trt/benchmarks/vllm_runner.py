"""The vLLM side of `make bench-vllm`, run by the python of vLLM's own venv (never imported there with dflash_trt).

It reads a JSON job (token-id prompts, new tokens, batch sizes), generates greedily with vLLM's offline
LLM API, with or without DFlash, and writes JSON: per batch size, the wall time, output tokens and each
prompt's new token ids. Standard library only at import time, so the project's tests can check its
argument handling and environment without vLLM installed.

    <venv>/bin/python vllm_runner.py --job job.json --out result.json --mode dflash --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

MODES = ("dflash", "plain")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vllm_runner", description=__doc__.splitlines()[0])
    parser.add_argument("--job", required=True, help="JSON: model, drafter, prompts (token ids), max_new_tokens, "
                                                     "batch_sizes, batch1_prompts, num_speculative_tokens")
    parser.add_argument("--out", required=True, help="where the JSON result goes")
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--threads", type=int, default=1, help="CPU cores vLLM's OpenMP threads bind to")
    parser.add_argument("--kv-cache-gb", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE (GiB)")
    parser.add_argument("--enforce-eager", action="store_true", help="no torch.compile of the model")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.kv_cache_gb < 1:
        parser.error(f"--kv-cache-gb must be >= 1, got {args.kv_cache_gb}")
    return args


def runner_env(threads: int, kv_cache_gb: int, cores: list[int] | None = None) -> dict[str, str]:
    """vLLM's CPU settings: its OpenMP threads bound to the first `threads` cores this process may use
    (VLLM_CPU_OMP_THREADS_BIND takes a core list, one thread per core), and the KV cache size in GiB."""
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    if threads > len(cores):
        raise ValueError(f"{threads} threads asked, {len(cores)} cores available")
    chosen = cores[:threads]
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, chosen)), "OMP_NUM_THREADS": str(threads),
            "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gb), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


def engine_kwargs(job: dict, mode: str, enforce_eager: bool) -> dict:
    """Keyword arguments of vllm.LLM for one mode: float32 (exact on CPU, as ours), the batch fits at once."""
    prompts = job["prompts"]
    longest = max(len(p) for p in prompts) + job["max_new_tokens"] + job["num_speculative_tokens"] + 1
    batch = max(job["batch_sizes"] + [1])
    kwargs = {"model": job["model"], "tokenizer": job["model"], "dtype": "float32", "seed": 0,
              "max_model_len": longest, "max_num_seqs": batch,
              "max_num_batched_tokens": max(2048, batch * longest), "enforce_eager": enforce_eager,
              "disable_log_stats": False}  # keeps the speculative-decoding counters of get_metrics()
    if mode == "dflash":
        kwargs["speculative_config"] = {"method": "dflash", "model": job["drafter"],
                                        "num_speculative_tokens": job["num_speculative_tokens"]}
    return kwargs


def run(job: dict, mode: str, enforce_eager: bool, log=print) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    started = time.perf_counter()
    llm = LLM(**engine_kwargs(job, mode, enforce_eager))
    log(f"vllm {mode}: engine ready in {time.perf_counter() - started:.0f} s")
    params = SamplingParams(temperature=0.0, max_tokens=job["max_new_tokens"], ignore_eos=True)
    warmup = SamplingParams(temperature=0.0, max_tokens=min(8, job["max_new_tokens"]), ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]

    def generate(batch: list, sampling=params) -> tuple[float, list[list[int]]]:
        start = time.perf_counter()
        outputs = llm.generate(batch, sampling, use_tqdm=False)
        return time.perf_counter() - start, [list(o.outputs[0].token_ids) for o in outputs]

    generate(prompts[:1], warmup)  # warm-up: first-call allocations and kernel selection
    runs = {}
    seconds, tokens = 0.0, []
    for prompt in prompts[:job["batch1_prompts"]]:  # one request at a time
        elapsed, [ids] = generate([prompt])
        seconds, tokens = seconds + elapsed, tokens + [ids]
    runs["1"] = {"seconds": seconds, "token_ids": tokens}
    log(f"vllm {mode}: batch 1 done ({seconds:.1f} s)")
    for size in job["batch_sizes"]:
        generate(prompts[:size], warmup)  # warm-up at this batch size (shapes first seen here)
        elapsed, tokens = generate(prompts[:size])
        runs[str(size)] = {"seconds": elapsed, "token_ids": tokens}
        log(f"vllm {mode}: batch {size} done ({elapsed:.1f} s)")
    return {"mode": mode, "runs": runs, "spec_decode": _spec_counters(llm)}


def _spec_counters(llm) -> dict:
    """vLLM's speculative-decoding counters (drafts, accepted tokens), when its metrics API has them."""
    try:
        metrics = llm.get_metrics()
    except Exception:  # an older or newer API: the counters are optional
        return {}
    return {m.name: m.value for m in metrics if m.name.startswith("vllm:spec_decode") and hasattr(m, "value")}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.update(runner_env(args.threads, args.kv_cache_gb))  # read by vLLM when it is imported
    with open(args.job) as handle:
        job = json.load(handle)
    result = run(job, args.mode, args.enforce_eager, log=lambda line: print(line, file=sys.stderr, flush=True))
    import vllm

    result["vllm_version"] = vllm.__version__
    with open(args.out, "w") as handle:
        json.dump(result, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
