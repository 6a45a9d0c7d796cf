"""Serving-overhead benchmark (a script, not a test): tokens/s through Triton vs the in-process loop.

    python -m dflash_trt.serving.overhead --engine engines/smollm2-135m [--prompts FILE]
        [--max-tokens 64] [--num-threads 0] [--json]

Both sides run the same engine through the same runtime, greedy, one request at a time, on the same
prompts: first in this process (runtime.steps), then through the real tritonserver (gRPC streaming
and HTTP /generate on the ensemble). The difference is what tokenization, the ensemble, the Python
backend's IPC and the network add. Outputs are compared so that a fast but wrong server shows up.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_PROMPTS = [
    "Explain in three sentences why the sky is blue.",
    "Write a haiku about autumn leaves.",
    "What is the capital of France, and what is it known for?",
    "List three uses of a paperclip.",
    "Describe how a bicycle works to a child.",
    "Give two tips for learning a new language.",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "Why do cats purr?",
]


@dataclass
class ModeResult:
    name: str
    num_tokens: int = 0
    seconds: float = 0.0
    texts: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds if self.seconds else 0.0


def read_prompts(path: Path | None) -> list[str]:
    if path is None:
        return list(DEFAULT_PROMPTS)
    prompts = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line:
            prompts.append(json.loads(line)["prompt"] if line.startswith("{") else line)
    return prompts


def in_process(engine: Path, prompts: list[str], max_tokens: int, num_threads: int) -> ModeResult:
    from dflash_trt.serving.detokenize import decode
    from dflash_trt.serving.generation import Stats, chunks
    from dflash_trt.serving.requests import GenerationRequest
    from dflash_trt.serving.runtime import open_runtime

    runtime = open_runtime(engine, num_threads=num_threads)
    result = ModeResult("in-process")
    end_ids = runtime.default_end_ids

    def run(text: str) -> tuple[int, str]:
        request = GenerationRequest(text, max_tokens, exclude_input_in_output=True)
        ids = runtime.tokenizer.encode(text)
        stats = Stats(runtime.block_size)
        (chunk,) = chunks(request, ids, runtime.steps(ids, request, end_ids), runtime.tokenizer, stats, end_ids)
        return stats.num_output_tokens, decode(runtime.tokenizer, chunk.window_ids)

    run(prompts[0])  # warm-up
    for text in prompts:
        start = time.perf_counter()
        num_tokens, answer = run(text)
        result.seconds += time.perf_counter() - start
        result.num_tokens += num_tokens
        result.texts.append(answer)
    del runtime
    gc.collect()
    return result


def served(engine: Path, prompts: list[str], max_tokens: int, num_threads: int) -> list[ModeResult]:
    from dflash_trt.serving.client import GrpcStream, generate, join_text
    from dflash_trt.serving.repo import RepoConfig, render_repository
    from dflash_trt.serving.server import serve_on_free_ports

    with tempfile.TemporaryDirectory(prefix="dflash-overhead-") as scratch:
        repo = render_repository(RepoConfig(engine, Path(scratch) / "repo", num_threads=num_threads))
        with serve_on_free_ports(repo) as server:
            generate(server.config.http_url, prompts[0], max_tokens)  # warm-up
            stream_result, http_result = ModeResult("triton gRPC stream"), ModeResult("triton HTTP generate")
            stream = GrpcStream(server.config.grpc_url)
            try:
                for text in prompts:
                    start = time.perf_counter()
                    answer = list(stream.chunks(text, max_tokens))
                    stream_result.seconds += time.perf_counter() - start
                    stream_result.num_tokens += answer[-1]["num_output_tokens"]
                    stream_result.texts.append(join_text(answer))
            finally:
                stream.close()
            for text in prompts:
                start = time.perf_counter()
                answer = generate(server.config.http_url, text, max_tokens, exclude_input_in_output=True)
                http_result.seconds += time.perf_counter() - start
                http_result.num_tokens += answer["num_output_tokens"]
                http_result.texts.append(answer["text_output"])
    return [stream_result, http_result]


def report(results: list[ModeResult]) -> dict:
    base = results[0]
    rows = []
    for r in results:
        overhead = (base.tokens_per_s / r.tokens_per_s - 1.0) * 100 if r.tokens_per_s else float("nan")
        rows.append({"mode": r.name, "tokens": r.num_tokens, "seconds": round(r.seconds, 3),
                     "tokens_per_s": round(r.tokens_per_s, 2), "overhead_percent": round(overhead, 1),
                     "identical_outputs": r.texts == base.texts})
    return {"results": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, help="one prompt per line, or JSON lines with a 'prompt' field")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--num-threads", type=int, default=0, help="torch CPU threads on both sides (0: default)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    prompts = read_prompts(args.prompts)
    results = [in_process(args.engine, prompts, args.max_tokens, args.num_threads)]
    results += served(args.engine, prompts, args.max_tokens, args.num_threads)
    summary = report(results)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{'mode':<22}{'tokens':>8}{'seconds':>10}{'tokens/s':>10}{'overhead':>10}  identical")
        for row in summary["results"]:
            print(f"{row['mode']:<22}{row['tokens']:>8}{row['seconds']:>10.2f}{row['tokens_per_s']:>10.1f}"
                  f"{row['overhead_percent']:>9.1f}%  {row['identical_outputs']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
