"""`python -m dflash_trt.gpu_check [--out DIR] [--quick] [--target-layers N] [--budget-s S]` (what `make gpu-check`
runs): the sections of this package in order of importance, a table on stdout and DIR/gpu-check.json."""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from dflash_trt.gpu_check.report import Section, exit_code, format_report, targets, write_json


def refusal() -> str | None:
    """One line saying why this machine cannot run the check, or None."""
    try:
        import torch
    except ImportError:
        return "gpu-check: torch is not installed"
    if torch.version.cuda is None:
        return f"gpu-check: torch {torch.__version__} is a CPU-only build; nothing was run (needs a CUDA GPU)"
    if not torch.cuda.is_available():
        return (f"gpu-check: no CUDA device visible to torch {torch.__version__} (CUDA {torch.version.cuda}); "
                "nothing was run")
    return None


def timed(name: str, fn) -> Section:
    """Run one section; an exception becomes an `error` section with its first line, not a crash."""
    start = time.perf_counter()
    try:
        section = fn()
    except Exception as exc:  # noqa: BLE001 - every failure of a section is reported, the others still run
        first = (str(exc).strip().splitlines() or [""])[0]
        section = Section(name, "error", f"{type(exc).__name__}: {first[:300]}")
    section.seconds = time.perf_counter() - start
    return section


def build_section() -> Section:
    from dflash_trt.decoding.kernels.plugin import cuda_op

    start = time.perf_counter()
    path = cuda_op.build_extension()
    cuda_op.load_cuda_op()
    row = {"library": path.name, "directory": str(path.parent), "seconds": time.perf_counter() - start}
    return Section("build the CUDA kernels (torch extension)", rows=[row])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("out/gpu-check"), help="directory of gpu-check.json")
    parser.add_argument("--quick", action="store_true", help="smaller shapes and an 8-layer target (a smoke run)")
    parser.add_argument("--target-layers", type=int, default=None, help="target depth (default 36, Qwen3-8B's)")
    parser.add_argument("--budget-s", type=float, default=450.0, help="skip sections that start after this")
    args = parser.parse_args(argv)
    reason = refusal()
    if reason:
        print(reason, file=sys.stderr)
        return 2

    import torch

    from dflash_trt.gpu_check import kernel_checks, model_checks, sanitizer, tree_times

    started = time.perf_counter()
    layers = args.target_layers or (8 if args.quick else 36)
    if layers < model_checks.DRAFT_LAYERS + 3:  # the drafter reads 5 distinct target layers in 1 .. N-3
        parser.error(f"--target-layers must be at least {model_checks.DRAFT_LAYERS + 3}")
    sections: list[Section] = []

    def greedy():
        # fp32 (no TF32) so that a 16-token verify and a 1-token step agree to the last decision; 8 layers suffice
        # for the loop's logic at the real width.
        section = model_checks.greedy_equality(*model_checks.build_pair(8, dtype=torch.float32))
        torch.cuda.empty_cache()
        return section

    plan = [
        ("build the CUDA kernels (torch extension)", build_section),
        ("kernel vs PyTorch reference", lambda: kernel_checks.correctness(args.quick)),
        ("CUDA graph capture and replay", kernel_checks.graphs),
        ("kernel time vs SDPA vs HBM floor", lambda: kernel_checks.timing(args.quick)),
        ("decoding loop on CUDA vs transformers greedy generate", greedy),
        ("step times and implied speedup", lambda: model_checks.step_times(*model_checks.build_pair(layers))),
        ("tree verify times and implied speedup", lambda: tree_times.tree_verify_times(
            *model_checks.build_pair(layers), spine_pair=model_checks.build_pair(8, dtype=torch.float32))),
        ("compute-sanitizer on small cases", lambda: sanitizer.run(
            timeout_s=max(60.0, args.budget_s - (time.perf_counter() - started)))),
    ]
    for name, fn in plan:
        if sections and sections[0].status != "pass":
            sections.append(Section(name, "skipped", "the kernels did not build"))
        elif time.perf_counter() - started > args.budget_s:
            sections.append(Section(name, "skipped", f"time budget of {args.budget_s:.0f} s spent"))
        else:
            sections.append(timed(name, fn))
            print(format_report(sections[-1:]), flush=True)
    sections.append(targets(sections))
    print(format_report(sections[-1:]), flush=True)
    meta = {"device": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "target_layers": layers, "quick": args.quick, "seconds": time.perf_counter() - started}
    path = write_json(args.out / "gpu-check.json", sections, meta)
    print(f"\ngpu-check: {sum(s.status == 'pass' for s in sections)} of {len(sections)} sections passed; "
          f"{path}", flush=True)
    return exit_code(sections)


if __name__ == "__main__":
    sys.exit(main())
