"""How tritonserver is started for an engine: plainly, or under MPI as NVIDIA does for TensorRT-LLM.

NVIDIA's Triton launcher for TensorRT-LLM (NVIDIA/TensorRT-LLM triton_backend/scripts/launch_triton_server.py)
runs `mpirun --allow-run-as-root -n 1 tritonserver ...`, or with `trtllm-llmapi-launch` before tritonserver;
for the LLM-API model the world size is 1 and TensorRT-LLM starts the tensor-parallel workers itself.
Its gpt-oss guide launches trtllm-serve the same way (docs/source/blogs/tech_blog/
blog9_Deploying_GPT_OSS_on_TRTLLM.md). The model process then clears the MPI job variables it inherited
from the server rank before creating the LLM (clear_inherited_mpi_env), as NVIDIA's llmapi Triton model
does (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py, before importing tensorrt_llm).

Launchers: plain (tritonserver alone), mpirun, trtllm-llmapi-launch (under mpirun), auto (mpirun for trtllm
engines, plain otherwise). The engine is found through the dflash model's engine_dir parameter.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import MutableMapping

from dflash_trt.errors import DFlashError

LAUNCHERS = ("auto", "plain", "mpirun", "trtllm-llmapi-launch")
MPIRUN = ("mpirun", "--allow-run-as-root", "-n", "1")
LLMAPI_LAUNCH = "trtllm-llmapi-launch"
# What mpirun gives its ranks to say which job they belong to (Open MPI, ORTE, PMIx, PRRTE, PMI): a child
# that keeps them tries to join that job. MCA settings (OMPI_MCA_*, PMIX_MCA_*, PRTE_MCA_*) are configuration
# and stay, except ORTE's runtime state under OMPI_MCA_orte_*; so do OMPI_ALLOW_RUN_AS_ROOT and the like.
MPI_JOB_PREFIXES = ("OMPI_COMM_WORLD_", "OMPI_MCA_orte_", "ORTE_", "PMIX_", "PRTE_", "PMI_")
MPI_JOB_NAMES = ("OMPI_UNIVERSE_SIZE", "OMPI_FIRST_RANKS", "OMPI_APP_CTX_NUM_PROCS")
MPI_CONFIG_PREFIXES = ("PMIX_MCA_", "PRTE_MCA_")
_ENGINE_DIR = re.compile(r'key:\s*"engine_dir"\s*value:\s*\{\s*string_value:\s*"((?:[^"\\]|\\.)*)"')


def clear_inherited_mpi_env(environ: MutableMapping[str, str]) -> list[str]:
    """Remove the MPI job's identity from `environ` (its configuration stays); returns the names removed."""
    names = [name for name in environ if (name.startswith(MPI_JOB_PREFIXES) or name in MPI_JOB_NAMES)
             and not name.startswith(MPI_CONFIG_PREFIXES)]
    for name in names:
        del environ[name]
    return sorted(names)


def repository_engine(repo: Path) -> Path | None:
    """The engine directory the repository's dflash model serves (None when the repo has no dflash model)."""
    config = Path(repo) / "dflash" / "config.pbtxt"
    if not config.is_file():
        return None
    match = _ENGINE_DIR.search(config.read_text())
    return Path(match.group(1).encode().decode("unicode_escape")) if match else None


def engine_runtime(engine_dir: Path | None) -> str | None:
    """The runtime named by an engine's manifest, or None when it cannot be read here."""
    if engine_dir is None or not (Path(engine_dir) / "manifest.json").is_file():
        return None
    import json

    return json.loads((Path(engine_dir) / "manifest.json").read_text()).get("runtime")


def launcher_prefix(choice: str, runtime: str | None) -> list[str]:
    """The words put before the tritonserver command for a launcher choice and the served runtime."""
    if choice not in LAUNCHERS:
        raise DFlashError(f"launcher {choice!r} is not one of {', '.join(LAUNCHERS)}")
    if choice == "auto":
        choice = "mpirun" if runtime == "trtllm" else "plain"
    if choice == "plain":
        return []
    prefix = list(MPIRUN)
    return prefix + [LLMAPI_LAUNCH] if choice == LLMAPI_LAUNCH else prefix


def launcher_for_repository(choice: str, repo: Path) -> list[str]:
    """launcher_prefix for the engine a repository serves."""
    return launcher_prefix(choice, engine_runtime(repository_engine(repo)))


def require_launcher(prefix: list[str]) -> None:
    """A clear error when the launcher's programs are not installed (they are in NGC's TensorRT-LLM images)."""
    for program in prefix[:1] + [word for word in prefix if word == LLMAPI_LAUNCH]:
        if shutil.which(program) is None:
            raise DFlashError(f"{program} is not installed: a TensorRT-LLM engine is served under it as NVIDIA "
                              "does (use the GPU image, or --launcher plain)")
