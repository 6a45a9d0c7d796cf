"""Build and load the CUDA kernels' PyTorch extension (plugins/dflashAttention/dflashAttentionTorch.cu), which defines
torch.ops.dflash_cuda.draft_attention_: the CUDA implementation of the ops in torch_op.py.

The extension is compiled once per (sources, torch, GPU architecture) with nvcc and the include and library paths
of torch.utils.cpp_extension, into plugins/build/torch_ext/<hash>/, under a file lock; neither ninja nor CMake is
needed.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import subprocess
from pathlib import Path

import torch

from dflash_trt.decoding.kernels.plugin.build import DEFAULT_BUILD_DIR, PLUGIN_SOURCE_DIR
from dflash_trt.errors import DFlashError

SOURCE_DIR = PLUGIN_SOURCE_DIR / "dflashAttention"
SOURCES = ("dflashAttentionTorch.cu", "dflashAttentionKernel.cu", "dflashAttentionConfig.cpp",
           "dflashAttentionPlan.cpp")
HEADERS = ("dflashAttentionKernel.h", "dflashAttentionParams.h", "dflashAttentionPlan.h", "dflashAttentionConfig.h",
           "dflashAttentionCommon.cuh", "dflashAttentionMma.cuh", "dflashAttentionScalar.cuh")
LIBRARY_NAME = "libdflash_attention_torch.so"
HEAD_DIMS = (64, 128)


class CudaOpUnavailable(DFlashError):
    """The CUDA operator cannot be built or loaded here (no CUDA device, no nvcc, or a CPU-only torch)."""


def gencode_flags(capability: tuple[int, int]) -> list[str]:
    """nvcc flags for one device: SASS for its architecture (sm_90 covers H100/H200, sm_100 B200, sm_120 RTX 50)."""
    arch = f"{capability[0]}{capability[1]}"
    return ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]


def nvcc_commands(nvcc: str, include_dirs: list[str], library_dirs: list[str], capability: tuple[int, int],
                  cxx11_abi: bool, out: Path) -> tuple[list[list[str]], list[str]]:
    """(one compile command per source, the link command): pure, tested without CUDA. The sources compile in
    parallel; torch's headers make each take about a minute."""
    flags = ["-std=c++20", "-O3", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr",
             f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11_abi)}", *gencode_flags(capability),
             *(f"-I{d}" for d in (*include_dirs, str(SOURCE_DIR)))]
    objects = [out.parent / f"{Path(source).stem}.o" for source in SOURCES]
    compiles = [[nvcc, "-c", *flags, str(SOURCE_DIR / source), "-o", str(obj)] for source, obj in zip(SOURCES, objects)]
    link = [nvcc, "-shared", *gencode_flags(capability), *(str(o) for o in objects),
            *(f"-L{d}" for d in library_dirs), *(f"-Xlinker=-rpath,{d}" for d in library_dirs),
            "-lc10", "-lc10_cuda", "-ltorch", "-ltorch_cpu", "-ltorch_cuda", "-o", str(out)]
    return compiles, link


def _run_all(commands: list[list[str]]) -> None:
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in commands]
    failures = []
    for command, proc in zip(commands, procs):
        output, _ = proc.communicate()
        if proc.returncode != 0:
            failures.append(f"{Path(command[-3]).name}: {output[-1500:]}")
    if failures:
        raise CudaOpUnavailable("nvcc failed to build the CUDA draft-attention op: " + " | ".join(failures))


def _source_hash(capability: tuple[int, int]) -> str:
    digest = hashlib.sha256(f"{torch.__version__} {torch.version.cuda} {capability}".encode())
    for name in (*SOURCES, *HEADERS):
        digest.update((SOURCE_DIR / name).read_bytes())
    return digest.hexdigest()[:16]


def build_extension(device: torch.device | int | None = None, build_root: Path = DEFAULT_BUILD_DIR) -> Path:
    """Compile the extension for `device` (default: the current CUDA device) unless already built; its path."""
    from torch.utils import cpp_extension

    if not torch.cuda.is_available() or torch.version.cuda is None:
        raise CudaOpUnavailable("the CUDA draft-attention op needs a CUDA build of torch and a CUDA device")
    if cpp_extension.CUDA_HOME is None:
        raise CudaOpUnavailable("the CUDA draft-attention op needs the CUDA toolkit (nvcc); set CUDA_HOME")
    capability = torch.cuda.get_device_capability(device)
    out_dir = build_root / "torch_ext" / _source_hash(capability)
    out = out_dir / LIBRARY_NAME
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.is_file():
            compiles, link = nvcc_commands(str(Path(cpp_extension.CUDA_HOME) / "bin" / "nvcc"),
                                           cpp_extension.include_paths("cuda"), cpp_extension.library_paths("cuda"),
                                           capability, torch._C._GLIBCXX_USE_CXX11_ABI, out.with_suffix(".tmp"))
            _run_all(compiles)
            _run_all([link])
            out.with_suffix(".tmp").rename(out)
    return out


@functools.lru_cache(maxsize=None)
def load_cuda_op():
    """torch.ops.dflash_cuda.draft_attention_, building the extension first if needed."""
    torch.ops.load_library(str(build_extension()))
    return torch.ops.dflash_cuda.draft_attention_


def rope_fields(rope, num_heads: int, num_kv_heads: int, head_dim: int) -> list[float]:
    """The op's field list of a drafter attention from its RotaryEmbedding (the same RoPE maths in C++)."""
    from dflash_trt.decoding.kernels.plugin.fields import AttentionFields, fields_to_list

    scaling = None
    if rope.yarn is not None:
        y = rope.yarn
        scaling = {"rope_type": "yarn", "factor": y.factor,
                   "original_max_position_embeddings": y.original_max_position_embeddings,
                   "beta_fast": y.beta_fast, "beta_slow": y.beta_slow, "mscale": y.mscale,
                   "mscale_all_dim": y.mscale_all_dim, "attention_factor": y.attention_factor,
                   "truncate": y.truncate}
    return fields_to_list(AttentionFields.from_rope(num_heads, num_kv_heads, head_dim, rope.theta, scaling))
