"""What a build step needs from the machine (GPU, TensorRT, TensorRT-LLM), and the error when it is absent."""

from __future__ import annotations

import importlib.util
import shutil

from dflash_trt.errors import DFlashError

CONTAINER_HINT = ("run the build in the GPU container (deploy/docker/gpu.Dockerfile: `docker build -f "
                  "deploy/docker/gpu.Dockerfile -t dflash-trt-gpu:0.1.0 .`, then `docker run --gpus all ... "
                  "dflash-trt-gpu:0.1.0 engine ...` with the same arguments)")


class StepUnavailable(DFlashError):
    """A build step cannot run on this machine; everything else was built."""

    def __init__(self, step: str, missing: str, hint: str = CONTAINER_HINT):
        self.step, self.missing, self.hint = step, missing, hint
        super().__init__(f"step '{step}' needs {missing}, which this machine lacks; {hint}")


def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def trtexec_path() -> str | None:
    return shutil.which("trtexec")


def require_cuda(step: str) -> None:
    if not has_cuda():
        raise StepUnavailable(step, "a CUDA GPU")


def require_module(step: str, module: str, what: str) -> None:
    if not has_module(module):
        raise StepUnavailable(step, f"{what} (Python module '{module}')")
