"""Memory soak: many mixed requests against a real tritonserver, with the RSS curve of its model processes.

    python -m dflash_trt.benchmarks.soak --engine engines/smollm2-135m --requests 3000 --max-minutes 15

It answers one question: does the memory of the model processes level off under a long mixed load, or does
it keep growing with the number of requests (a leak)? The mix is seeded and bounded in count and time:
prompt lengths from a few words to several hundred, max_tokens from 1 to --max-new-tokens, streamed over
gRPC, plain HTTP /generate, and streams cancelled after their first chunk. Every --sample-every requests
the RSS of tritonserver and of each Python stub (one per model instance) is recorded. The report gives,
per process, the RSS after the warm-up, the peak, the last value, and the growth per 1,000 requests over
the second half of the run: near zero when the process has levelled off.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

WORDS = ("the quick brown fox jumps over a lazy dog while seven sailors count the waves of an old grey sea "
         "and every answer needs a number a colour or a reason").split()
PROMPT_WORDS = (4, 16, 64, 200, 400)
KINDS = ("stream", "generate", "cancel")
KIND_WEIGHTS = (0.5, 0.3, 0.2)


@dataclass
class SoakConfig:
    requests: int = 3000
    max_minutes: float = 15.0
    concurrency: int = 4
    max_new_tokens: int = 48
    sample_every: int = 100
    seed: int = 0


@dataclass
class Sample:
    num_requests: int
    elapsed_s: float
    rss_mib: dict[str, float]


@dataclass
class SoakResult:
    samples: list[Sample] = field(default_factory=list)
    num_errors: int = 0
    first_errors: list[str] = field(default_factory=list)


def model_processes(server_pid: int) -> dict[str, int]:
    """tritonserver and its Python stubs, named by model instance ("dflash_0_0"), as name -> pid."""
    import psutil

    server = psutil.Process(server_pid)
    found = {"tritonserver": server.pid}
    for child in server.children(recursive=True):
        try:
            cmdline = child.cmdline()
        except psutil.Error:
            continue
        if cmdline and cmdline[0].endswith("triton_python_backend_stub") and len(cmdline) > 8:
            found[cmdline[8]] = child.pid  # the stub's arguments: model.py, shm region, sizes, ..., instance name
    return found


def rss_mib(pids: dict[str, int]) -> dict[str, float]:
    import psutil

    values = {}
    for name, pid in pids.items():
        try:
            values[name] = psutil.Process(pid).memory_info().rss / 2**20
        except psutil.Error:
            values[name] = float("nan")  # a stub that died: the curve shows it
    return values


def request_plan(config: SoakConfig) -> list[tuple[str, str, int]]:
    """(kind, prompt, max_tokens) of every request, from the seed alone."""
    rng = random.Random(config.seed)
    plan = []
    for _ in range(config.requests):
        words = rng.choice(PROMPT_WORDS)
        prompt = " ".join(rng.choice(WORDS) for _ in range(words))
        plan.append((rng.choices(KINDS, KIND_WEIGHTS)[0], prompt, rng.randint(1, config.max_new_tokens)))
    return plan


def one_request(server, kind: str, prompt: str, max_tokens: int) -> None:
    from dflash_trt.serving.client import GrpcStream, generate

    if kind == "generate":
        generate(server.config.http_url, prompt, max_tokens, timeout_s=600)
        return
    stream = GrpcStream(server.config.grpc_url)
    try:
        for _chunk in stream.chunks(prompt, max_tokens, timeout_s=600):
            if kind == "cancel":
                stream.cancel()  # the client goes away after the first chunk
                return
    finally:
        stream.close()


def run_soak(server, config: SoakConfig, log=print) -> SoakResult:
    """Send the plan with `concurrency` workers until done or out of time; sample RSS as requests complete."""
    plan = request_plan(config)
    pids = model_processes(server._process.pid)
    result = SoakResult()
    lock = threading.Lock()
    next_index, done = [0], [0]
    start = time.monotonic()
    deadline = start + config.max_minutes * 60

    def sample() -> None:
        point = Sample(done[0], time.monotonic() - start, rss_mib(pids))
        result.samples.append(point)
        log(f"{point.num_requests:6d} requests {point.elapsed_s:7.0f} s  " +
            "  ".join(f"{name} {mib:7.1f}" for name, mib in point.rss_mib.items()))

    def worker() -> None:
        while time.monotonic() < deadline:
            with lock:
                if next_index[0] >= len(plan):
                    return
                kind, prompt, max_tokens = plan[next_index[0]]
                next_index[0] += 1
            try:
                one_request(server, kind, prompt, max_tokens)
            except Exception as error:  # noqa: BLE001 - counted and shown; the soak goes on
                with lock:
                    result.num_errors += 1
                    if len(result.first_errors) < 5:
                        result.first_errors.append(f"{kind}: {error}")
            with lock:
                done[0] += 1
                if done[0] % config.sample_every == 0:
                    sample()

    sample()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(config.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if result.samples[-1].num_requests != done[0]:
        sample()
    return result


def growth_per_1000(samples: list[Sample], name: str) -> float:
    """Least-squares slope of RSS against requests over the second half of the samples, MiB per 1,000."""
    half = [s for s in samples[len(samples) // 2:]]
    xs = [s.num_requests for s in half]
    ys = [s.rss_mib[name] for s in half]
    if len(xs) < 2 or max(xs) == min(xs):
        return float("nan")
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return slope * 1000


def summary(result: SoakResult) -> dict:
    samples = result.samples
    warm = samples[1] if len(samples) > 1 else samples[0]  # after the first --sample-every requests
    return {
        "num_requests": samples[-1].num_requests,
        "elapsed_s": round(samples[-1].elapsed_s, 1),
        "num_errors": result.num_errors,
        "first_errors": result.first_errors,
        "processes": {name: {"start_mib": round(samples[0].rss_mib[name], 1),
                             "after_warmup_mib": round(warm.rss_mib[name], 1),
                             "peak_mib": round(max(s.rss_mib[name] for s in samples), 1),
                             "last_mib": round(samples[-1].rss_mib[name], 1),
                             "second_half_mib_per_1000_requests": round(growth_per_1000(samples, name), 1)}
                      for name in samples[0].rss_mib},
        "curve": [{"num_requests": s.num_requests, "elapsed_s": round(s.elapsed_s, 1),
                   "rss_mib": {k: round(v, 1) for k, v in s.rss_mib.items()}} for s in samples],
    }


def main(argv=None) -> int:
    from dflash_trt.serving.repo import RepoConfig, render_repository
    from dflash_trt.serving.server import serve_on_free_ports

    defaults = SoakConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--engine", type=Path, help="engine directory (a repository is rendered for it)")
    source.add_argument("--repo", type=Path, help="a rendered model repository")
    parser.add_argument("--requests", type=int, default=defaults.requests)
    parser.add_argument("--max-minutes", type=float, default=defaults.max_minutes, help="stop sending after this")
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    parser.add_argument("--sample-every", type=int, default=defaults.sample_every, help="requests between samples")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--out", type=Path, help="write the summary and the curve here (JSON)")
    args = parser.parse_args(argv)
    config = SoakConfig(args.requests, args.max_minutes, args.concurrency, args.max_new_tokens, args.sample_every,
                        args.seed)
    with tempfile.TemporaryDirectory(prefix="dflash-soak-") as scratch:
        repo = args.repo
        if repo is None:
            repo = Path(scratch) / "repo"
            render_repository(RepoConfig(args.engine, repo, canary_tokens=0))
        with serve_on_free_ports(repo, ready_timeout_s=600) as server:
            result = run_soak(server, config)
    report = summary(result)
    for name, figures in report["processes"].items():
        print(f"{name:>20}: after warm-up {figures['after_warmup_mib']:.1f} MiB, peak {figures['peak_mib']:.1f}, "
              f"last {figures['last_mib']:.1f}, second half {figures['second_half_mib_per_1000_requests']:+.1f} "
              "MiB per 1000 requests")
    print(f"{report['num_requests']} requests in {report['elapsed_s']:.0f} s, {report['num_errors']} errors")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
