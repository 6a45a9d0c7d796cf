"""Build and load the batch-invariant CPU kernels: torch.ops.dflash_cpu.block_matmul and
torch.ops.dflash_cpu.rowwise_attention (cpu_kernels.cpp), torch.ops.dflash_cpu.llama_decoder, a Llama target's
decoder layers in one call (llama_decoder.cpp), and torch.ops.dflash_cpu.draft_decoder, a Q8_0 DFlash drafter's
layers in one call (draft_decoder.cpp); the last two share decoder_parts.cpp.

The library is compiled once per (source, torch version) with the C++ compiler and torch's own include and library
paths, into plugins/build/cpu_ext/<hash>/ under a file lock (parallel callers wait for one another); it takes
about half a minute the first time. No CMake or ninja is needed: one g++ command.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import torch

from dflash_trt.decoding.kernels.plugin.build import DEFAULT_BUILD_DIR
from dflash_trt.errors import ConfigError

SOURCES = tuple(Path(__file__).with_name(name)
                for name in ("cpu_kernels.cpp", "decoder_parts.cpp", "llama_decoder.cpp", "draft_decoder.cpp"))
HEADERS = tuple(Path(__file__).with_name(name) for name in ("cpu_kernels.h", "decoder_parts.h"))
LIBRARY_NAME = "libdflash_cpu_kernels.so"
# The C++ compiler to use (default: $CXX, else g++).
COMPILER_ENV = "CXX"


class NativeKernelsUnavailable(ConfigError):
    """The CPU kernels cannot be built here (no C++ compiler, or it failed)."""


def compile_command(compiler: str, out: Path) -> list[str]:
    """The one g++ command that builds the library."""
    from torch.utils import cpp_extension

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    # -ffp-contract=off: a product and a sum are never fused into one rounding (the ops reproduce torch's bits).
    return [compiler, "-std=c++20", "-O3", "-ffp-contract=off", "-fPIC", "-shared", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            *(f"-I{d}" for d in cpp_extension.include_paths()), *map(str, SOURCES),
            *(f"-L{d}" for d in cpp_extension.library_paths()),
            *(f"-Wl,-rpath,{d}" for d in cpp_extension.library_paths()),
            "-lc10", "-ltorch_cpu", "-ltorch", "-o", str(out)]


def _source_hash() -> str:
    digest = hashlib.sha256(f"{torch.__version__} {torch._C._GLIBCXX_USE_CXX11_ABI}".encode())
    for path in SOURCES + HEADERS:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def build_library(build_root: Path = DEFAULT_BUILD_DIR) -> Path:
    """Compile the library unless already built; its path."""
    compiler = shutil.which(os.environ.get(COMPILER_ENV, "g++"))
    out_dir = build_root / "cpu_ext" / _source_hash()
    out = out_dir / LIBRARY_NAME
    if out.is_file():
        return out
    if compiler is None:
        raise NativeKernelsUnavailable("the GGUF-precision CPU kernels need a C++ compiler (g++; set CXX to another); "
                                       "install one or load the target with --weights float")
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.is_file():
            tmp = out.with_suffix(".tmp")
            proc = subprocess.run(compile_command(compiler, tmp), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
            if proc.returncode != 0:
                names = ", ".join(path.name for path in SOURCES)
                raise NativeKernelsUnavailable(f"building {names} failed:\n{proc.stdout[-3000:]}")
            tmp.rename(out)
    return out


# torch.ops.dflash_cpu.block_matmul.default once load() ran (hot callers use it directly).
BLOCK_MATMUL = None


@functools.lru_cache(maxsize=None)
def load() -> None:
    """Register torch.ops.dflash_cpu.*, building the library first if needed."""
    global BLOCK_MATMUL
    torch.ops.load_library(str(build_library()))
    BLOCK_MATMUL = torch.ops.dflash_cpu.block_matmul.default


def rowwise_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                      scale: float) -> torch.Tensor:
    load()
    return torch.ops.dflash_cpu.rowwise_attention(query, key, value, mask, scale)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1), the same indices: through the native op (~10x faster) where the kernels are loaded
    already (a target at its GGUF precision runs them) and x is float32 on CPU, else torch's own."""
    if BLOCK_MATMUL is not None and x.dtype == torch.float32 and x.device.type == "cpu" and x.shape[-1] > 0:
        return torch.ops.dflash_cpu.argmax_rows(x)
    return torch.argmax(x, dim=-1)


def has_vnni() -> bool:
    """True where the int8 dot products run as AVX512-VNNI (else the scalar path)."""
    load()
    return bool(torch.ops.dflash_cpu.has_vnni())


def use_vector_kernels(enabled: bool) -> None:
    """False: every op takes its scalar path (the one a CPU without AVX512 runs); for tests."""
    load()
    torch.ops.dflash_cpu.use_vector_kernels(enabled)
