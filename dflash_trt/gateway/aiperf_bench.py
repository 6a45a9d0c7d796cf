"""`make bench-aiperf`: NVIDIA AIPerf drives the OpenAI-compatible gateway in front of the real Triton server.

AIPerf (PyPI `aiperf`, pinned in pyproject's `aiperf` extra) gets its own venv (.venv-aiperf): it
brings pandas, pyarrow, dash and uvloop/httptools, and the last two would change how uvicorn serves
the gateway in the project's venv. It runs offline: the engine's tokenizer is laid out as a local
Hugging Face cache entry, which AIPerf resolves without the network. tau comes from the dflash
model's Prometheus counters, read before and after each AIPerf run. The same sweep then runs against
the engine served with block size 1 (plain decoding), so DFlash is compared with its baseline under
the same load (--no-plain skips it).

    python -m dflash_trt.gateway.aiperf_bench --engine engines/smollm2-135m --out out/aiperf
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dflash_trt.errors import DFlashError

TOKENIZER_REPO = "dflash-trt/served-tokenizer"  # the name AIPerf looks up in the local cache


@dataclass
class AiperfConfig:
    """One AIPerf sweep over concurrency levels (chat, streaming, greedy, fixed lengths)."""

    engine: Path
    out: Path = Path("out/aiperf")
    concurrency: tuple[int, ...] = (1, 4)
    request_count: int = 16
    input_tokens: int = 128
    output_tokens: int = 64
    venv: Path = Path(".venv-aiperf")
    # AIPerf's timing loop polls a core; on a small CPU host it would starve the server it measures.
    # It runs at this niceness (0: as the server), with one worker and no GPU/server-metrics scrapers.
    nice: int = 10
    # "heldout": the held-out prompts of data/prompts (the families the drafter is for, interleaved);
    # "synthetic": AIPerf's own random prompts of exactly input_tokens tokens.
    dataset: str = "heldout"
    prompts_dir: Path = Path("data/prompts")
    compare_plain: bool = True  # also serve with block size 1 (plain decoding) under the same load
    num_threads: int = 0  # torch threads per dflash instance (0: the cores divided among the instances)
    instances: int = 1  # dflash model instances (each batches in flight), as `make bench` serves
    ready_timeout_s: float = 600.0
    extra_args: tuple[str, ...] = field(default_factory=tuple)


def aiperf_requirement() -> str:
    """The pinned `aiperf==X` of pyproject's `aiperf` extra, from the installed project's metadata."""
    for requirement in importlib.metadata.requires("dflash-trt") or ():
        if requirement.startswith("aiperf") and re.search(r"extra\s*==\s*['\"]aiperf['\"]", requirement):
            return requirement.split(";")[0].strip()
    raise DFlashError("pyproject.toml has no `aiperf` extra: run `make setup`")


def ensure_aiperf(venv: Path) -> Path:
    """The aiperf executable of `venv`, installing the pinned version there when it is missing."""
    requirement = aiperf_requirement()
    executable = venv / "bin" / "aiperf"
    version = requirement.split("==")[-1]
    if executable.is_file() and version in _output([str(executable), "--version"]):
        return executable
    if not (venv / "bin" / "python").is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    print(f"installing {requirement} into {venv} ...", flush=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", requirement], check=True)
    return executable


def tokenizer_cache(engine: Path, hf_home: Path) -> str:
    """Lay the engine's tokenizer out as a cached Hugging Face repository; returns its repo id."""
    from dflash_trt.serving.tokenizers import tokenizer_for

    entry = hf_home / "hub" / ("models--" + TOKENIZER_REPO.replace("/", "--"))
    snapshot = entry / "snapshots" / "local"
    snapshot.mkdir(parents=True, exist_ok=True)
    (entry / "refs").mkdir(exist_ok=True)
    (entry / "refs" / "main").write_text("local")
    tokenizer, _engine = tokenizer_for(engine)
    tokenizer.save_pretrained(str(snapshot))
    return TOKENIZER_REPO


def heldout_dataset(prompts_dir: Path, path: Path) -> Path:
    """The held-out prompts as AIPerf's single_turn JSONL, families interleaved so any prefix mixes them."""
    from dflash_trt.data.prompts import load_prompts

    by_family: dict[str, list[str]] = {}
    for family, prompt in load_prompts(prompts_dir, "heldout"):
        if isinstance(prompt, str):  # single_turn: multi-turn prompts (chat message lists) are left out
            by_family.setdefault(family, []).append(prompt)
    if not by_family:
        raise DFlashError(f"{prompts_dir}: no held-out prompts (<family>/heldout.jsonl)")
    rounds = zip(*by_family.values())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": prompt}) + "\n" for group in rounds for prompt in group))
    return path


def aiperf_command(executable: Path, config: AiperfConfig, url: str, model: str, concurrency: int,
                   out: Path, dataset: Path | None = None) -> list[str]:
    """AIPerf's command line; `dataset` (a single_turn JSONL) replaces the synthetic prompts."""
    if dataset is None:
        prompts = ["--prompt-input-tokens-mean", str(config.input_tokens), "--prompt-input-tokens-stddev", "0"]
    else:
        prompts = ["--input-file", str(dataset), "--custom-dataset-type", "single_turn",
                   "--dataset-sampling-strategy", "sequential"]
    return [str(executable), "profile", "-m", model, "--url", url, "--endpoint-type", "chat", "--streaming",
            "--tokenizer", TOKENIZER_REPO, "--concurrency", str(concurrency),
            "--request-count", str(config.request_count), "--warmup-request-count", "1", *prompts,
            "--output-tokens-mean", str(config.output_tokens), "--output-tokens-stddev", "0",
            # Greedy, and every answer runs to the requested length (AIPerf's advice for fixed output lengths).
            "--extra-inputs", json.dumps({"temperature": 0, "ignore_eos": True}), "--use-server-token-count",
            "--ui-type", "none",
            "--random-seed", "0", "--output-artifact-dir", str(out), "--workers-max", "1",
            "--record-processors", "1", "--no-gpu-telemetry", "--no-server-metrics", *config.extra_args]


def run_aiperf(command: list[str], env: dict, log_path: Path, nice: int) -> None:
    """Run AIPerf in its own process group, so that an interrupted benchmark leaves none of its services behind."""
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   preexec_fn=(lambda: os.nice(nice)) if nice else None)
        try:
            code = process.wait()
        finally:
            _stop_group(process)
    if code:
        raise DFlashError(f"aiperf exited with status {code}; see {log_path}")


def _stop_group(process: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue


def run(config: AiperfConfig) -> dict:
    """Serve the engine (Triton + gateway) with DFlash, then with plain decoding (block size 1), and run
    AIPerf at each concurrency against each; returns and writes the summary."""
    if config.dataset not in ("heldout", "synthetic"):
        raise DFlashError(f"dataset must be 'heldout' or 'synthetic', got {config.dataset!r}")
    out = Path(config.out).resolve()
    executable = ensure_aiperf(Path(config.venv))
    tokenizer_cache(config.engine, out / "hf-cache")
    dataset = heldout_dataset(config.prompts_dir, out / "heldout.jsonl") if config.dataset == "heldout" else None
    modes = {"dflash": 0, "plain": 1} if config.compare_plain else {"dflash": 0}
    results, model = {}, ""
    for mode, block_size in modes.items():
        model, results[mode] = _run_mode(config, executable, out / mode, out / "hf-cache", block_size, dataset)
    summary = {"engine": str(config.engine), "model": model, "config": _jsonable(asdict(config)),
               "aiperf": aiperf_requirement(), "modes": results}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(format_table(results))
    return summary


def _run_mode(config: AiperfConfig, executable: Path, out: Path, hf_cache: Path, block_size: int,
              dataset: Path | None) -> tuple[str, dict]:
    """One served repository (block_size 0: the engine's, 1: plain decoding) under AIPerf at each level."""
    from dflash_trt.gateway.companion import gateway_beside
    from dflash_trt.serving.repo import RepoConfig, render_repository
    from dflash_trt.serving.server import free_ports, serve_on_free_ports

    repo = render_repository(RepoConfig(engine_dir=config.engine, out=out / "repo", block_size=block_size,
                                        num_threads=config.num_threads, dflash_instances=config.instances,
                                        max_queue_size=max(64, 4 * max(config.concurrency))))
    env = {**os.environ, "HF_HOME": str(hf_cache), "HF_HUB_OFFLINE": "1"}
    levels = {}
    with serve_on_free_ports(repo, ready_timeout_s=config.ready_timeout_s, log_path=out / "triton.log") as server:
        [port] = free_ports(1)  # the gateway's
        with gateway_beside(port, server.config.grpc_port, "127.0.0.1", config.ready_timeout_s):
            url = f"http://127.0.0.1:{port}"
            model = _wait_for_gateway(url, config.ready_timeout_s)
            for concurrency in config.concurrency:
                before = _counters(server.config.metrics_url)
                level_out = out / f"concurrency-{concurrency}"
                command = aiperf_command(executable, config, url, model, concurrency, level_out, dataset)
                print(f"aiperf, {out.name}, concurrency {concurrency} ...", flush=True)
                run_aiperf(command, env, out / f"aiperf-{concurrency}.log", config.nice)
                levels[str(concurrency)] = level_summary(level_out / "profile_export_aiperf.json", before,
                                                         _counters(server.config.metrics_url))
    return model, levels


def level_summary(export: Path, before: dict[str, float], after: dict[str, float]) -> dict:
    """AIPerf's headline figures of one run, plus tau from the dflash counters over that run."""
    data = json.loads(Path(export).read_text())
    steps = after["dflash_spec_steps_total"] - before["dflash_spec_steps_total"]
    accepted = after["dflash_accepted_draft_tokens_total"] - before["dflash_accepted_draft_tokens_total"]
    return {
        "num_requests": int(data["request_count"]["avg"]),
        "num_errors": len(data.get("error_summary") or []),
        "output_tokens_per_s": data["output_token_throughput"]["avg"],
        "requests_per_s": data["request_throughput"]["avg"],
        "ttft_p50_ms": data["time_to_first_token"]["p50"],
        "itl_p50_ms": data["inter_token_latency"]["p50"],
        "latency_p50_ms": data["request_latency"]["p50"],
        "tau": 1 + accepted / steps if steps else 0.0,
    }


def format_table(modes: dict[str, dict[str, dict]]) -> str:
    """Markdown table: one row per mode and concurrency, then DFlash / plain output tokens/s per level."""
    lines = ["| mode | concurrency | requests | output tok/s | TTFT p50 (ms) | ITL p50 (ms) | latency p50 (ms) | tau |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, levels in modes.items():
        for level, s in levels.items():
            lines.append(f"| {mode} | {level} | {s['num_requests']} | {s['output_tokens_per_s']:.1f} | "
                         f"{s['ttft_p50_ms']:.0f} | {s['itl_p50_ms']:.1f} | {s['latency_p50_ms']:.0f} | "
                         f"{s['tau']:.2f} |")
    if "plain" in modes and "dflash" in modes:
        ratios = [f"{level}: {s['output_tokens_per_s'] / modes['plain'][level]['output_tokens_per_s']:.2f}x"
                  for level, s in modes["dflash"].items()
                  if modes["plain"].get(level, {}).get("output_tokens_per_s")]
        lines.append("")
        lines.append("output tokens/s, DFlash / plain, by concurrency: " + ", ".join(ratios))
    return "\n".join(lines)


def _wait_for_gateway(url: str, timeout_s: float) -> str:
    """The served model's name once the gateway answers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5) as response:
                return json.loads(response.read())["data"][0]["id"]
        except OSError:
            time.sleep(0.5)
    raise DFlashError(f"the OpenAI gateway at {url} did not answer within {timeout_s:.0f} s")


def _counters(metrics_url: str) -> dict[str, float]:
    from dflash_trt.serving.metrics import scrape_totals

    return scrape_totals(metrics_url, ("dflash_spec_steps_total", "dflash_accepted_draft_tokens_total"))


def _output(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _jsonable(values: dict) -> dict:
    return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v) for k, v in values.items()}


def _raise_interrupt(_signum, _frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    defaults = AiperfConfig(engine=Path())
    parser = argparse.ArgumentParser(prog="bench-aiperf", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, required=True, help="engine directory (built by `make engine`)")
    parser.add_argument("--out", type=Path, default=defaults.out)
    parser.add_argument("--concurrency", type=lambda s: tuple(int(x) for x in s.split(",")),
                        default=defaults.concurrency, help="comma-separated levels (default: 1,4)")
    parser.add_argument("--request-count", type=int, default=defaults.request_count)
    parser.add_argument("--input-tokens", type=int, default=defaults.input_tokens)
    parser.add_argument("--output-tokens", type=int, default=defaults.output_tokens)
    parser.add_argument("--nice", type=int, default=defaults.nice,
                        help="niceness of AIPerf's processes (default 10: the server under test comes first)")
    parser.add_argument("--dataset", choices=("heldout", "synthetic"), default=defaults.dataset,
                        help="heldout (default): the held-out prompt sets; synthetic: AIPerf's random prompts "
                             "of --input-tokens tokens")
    parser.add_argument("--prompts-dir", type=Path, default=defaults.prompts_dir)
    parser.add_argument("--no-plain", dest="compare_plain", action="store_false",
                        help="skip the plain-decoding (block size 1) run that DFlash is compared with")
    parser.add_argument("--num-threads", type=int, default=defaults.num_threads,
                        help="torch threads per dflash instance (default 0: the cores divided among the instances)")
    parser.add_argument("--instances", type=int, default=defaults.instances,
                        help="dflash model instances per served repository (default: %(default)s)")
    parser.add_argument("--venv", type=Path, default=defaults.venv, help="AIPerf's own venv (default: .venv-aiperf)")
    args, extra = parser.parse_known_args(argv)
    from dflash_trt.engine.build import ensure_engine
    from dflash_trt.errors import DFlashError

    try:
        engine = ensure_engine(args.engine, log=lambda line: print(line, flush=True))
    except DFlashError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    config = AiperfConfig(engine=engine, out=args.out, concurrency=args.concurrency,
                          request_count=args.request_count, input_tokens=args.input_tokens,
                          output_tokens=args.output_tokens, venv=args.venv, nice=args.nice,
                          compare_plain=args.compare_plain, dataset=args.dataset, prompts_dir=args.prompts_dir,
                          num_threads=args.num_threads, instances=args.instances, extra_args=tuple(extra))
    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so Triton, the gateway and AIPerf are stopped.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        run(config)
    except KeyboardInterrupt:
        print("interrupted: servers stopped", file=sys.stderr)
        return 130
    except DFlashError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
