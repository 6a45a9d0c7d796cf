"""gpu-check section: compute-sanitizer memcheck and racecheck over the small cases (a fresh Python process each)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from dflash_trt.gpu_check.report import Section

TOOLS = ("memcheck", "racecheck")
# Ways to restrict the checks to the project's kernels (namespace dflash), newest spelling first; a sanitizer that
# rejects one prints no ERROR SUMMARY, and the next is tried.
KERNEL_FILTERS = (("--kernel-name", "kns=dflash"), ("--kernel-regex", "kns=dflash"), ())


def sanitizer_command(sanitizer: str, tool: str, kernel_filter: tuple[str, ...] = KERNEL_FILTERS[0]) -> list[str]:
    # --error-exitcode makes a reported hazard fail the run.
    return [sanitizer, "--tool", tool, "--error-exitcode", "3", *kernel_filter,
            sys.executable, "-m", "dflash_trt.gpu_check.small_case"]


def find_sanitizer() -> str | None:
    from torch.utils import cpp_extension

    found = shutil.which("compute-sanitizer")
    if found:
        return found
    if cpp_extension.CUDA_HOME:
        candidate = Path(cpp_extension.CUDA_HOME) / "bin" / "compute-sanitizer"
        return str(candidate) if candidate.is_file() else None
    return None


def run(timeout_s: float) -> Section:
    section = Section("compute-sanitizer on small cases")
    sanitizer = find_sanitizer()
    if sanitizer is None:
        section.status, section.message = "skipped", "compute-sanitizer not found (CUDA toolkit bin/)"
        return section
    for tool in TOOLS:
        for kernel_filter in KERNEL_FILTERS:
            proc = subprocess.run(sanitizer_command(sanitizer, tool, kernel_filter), capture_output=True, text=True,
                                  timeout=timeout_s / len(TOOLS))
            summary = next((line for line in reversed((proc.stdout + proc.stderr).splitlines())
                            if "ERROR SUMMARY" in line), "")
            if summary:
                break
        summary = summary.replace("=========", "").strip()
        section.rows.append({"tool": tool, "exit": proc.returncode, "summary": summary})
        if proc.returncode != 0:
            # Exit 3 is a hazard the tool reported; any other is the small cases' own failure, whose first line
            # (small_case.py prints one per mismatch) says what differed.
            lines = [line for line in (proc.stdout + proc.stderr).strip().splitlines() if "=========" not in line]
            detail = summary if proc.returncode == 3 else (lines[:1] or [summary])[0]
            section.status, section.message = "fail", f"{tool} exited {proc.returncode}: {detail[:200]}"
    return section
