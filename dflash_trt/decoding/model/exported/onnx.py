"""The `onnx` runtime's drafter: the exported graph run by onnxruntime with the plugin's custom-op library.

`OnnxDrafter` offers what the decoding loop uses of the PyTorch drafter (config, new_cache, propose), so
`generate(target, OnnxDrafter(...), ...)` runs the same loop; the drafter's host part (embeddings in, draft
choice out: exported.head) runs in torch. Graph values are fp32 or fp16 (numpy has no bf16).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch

from dflash_trt.decoding.kernels.plugin.onnx_node import ort_library
from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.decoding.model.context_cache import ContextCache
from dflash_trt.decoding.model.drafters import DrafterBase
from dflash_trt.decoding.model.exported.export import cache_names
from dflash_trt.decoding.model.exported.head import ExportedDrafter, draft_head
from dflash_trt.errors import DFlashError

_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
_TORCH_TYPES = {np.float32: torch.float32, np.float16: torch.float16}


class OnnxDrafter(ExportedDrafter):
    """A drafter ONNX file (dflash_trt.decoding.model.exported.export) run by onnxruntime on CPU."""

    def __init__(self, onnx_path: str | Path, head: DrafterBase, provider: str = "auto"):
        """head: the drafter's host part (exported.head.load_draft_head of its directory).

        provider: "library" (C++ custom-op library), "python" (onnxruntime-extensions op, fp32) or "auto".
        """
        import onnxruntime as ort

        library, model = _custom_op(onnx_path, provider)
        options = ort.SessionOptions()
        options.register_custom_ops_library(library)
        self.session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self.head = head
        value_type = self.session.get_inputs()[0].type
        if value_type not in _NUMPY_TYPES:
            raise DFlashError(f"the onnx runtime runs fp32 or fp16 drafters, not {value_type}")
        self.dtype = _NUMPY_TYPES[value_type]
        self._cache_inputs = cache_names(head.config.num_hidden_layers)

    @property
    def static_block_size(self) -> int | None:
        """The block size the graph was exported for (its block_embeds input has a fixed length)."""
        length = next(i for i in self.session.get_inputs() if i.name == "block_embeds").shape[1]
        return length if isinstance(length, int) else None

    def new_cache(self, batch_size: int, capacity: int) -> ContextCache:
        # Torch tensors on the host: numpy views of them feed the session without a copy.
        windows = [None] * self.config.num_hidden_layers  # the graph attends to every context row
        return ContextCache(self.config, batch_size, capacity, _TORCH_TYPES[self.dtype], "cpu", windows)

    def __call__(self, block_embeds: torch.Tensor, features: torch.Tensor, ctx_lens: torch.Tensor,
                 cache: ContextCache) -> torch.Tensor:
        """One draft forward (same contract as DFlashDrafter.forward); returns hidden [B,S,D] as a tensor."""
        if cache.capacity < int((cache.lens + ctx_lens.cpu()).max()):
            raise ValueError("draft cache too small for the context")
        feeds = {
            "block_embeds": block_embeds.detach().cpu().numpy().astype(self.dtype, copy=False),
            "features": features.detach().cpu().numpy().astype(self.dtype, copy=False),
            "cache_lens": cache.lens.numpy().astype(np.int32),
            "ctx_lens": ctx_lens.cpu().numpy().astype(np.int32),
        }
        caches = [t.numpy() for pair in zip(cache.k, cache.v) for t in pair]
        feeds.update(zip(self._cache_inputs, caches))
        hidden, *new_caches = self.session.run(None, feeds)
        new_caches = [torch.from_numpy(a) for a in new_caches]
        cache.k, cache.v = new_caches[0::2], new_caches[1::2]
        cache.lens = cache.lens + ctx_lens.cpu()
        return torch.from_numpy(hidden).to(block_embeds.dtype)


def _custom_op(onnx_path: str | Path, provider: str) -> tuple[str, str | bytes]:
    """(custom-op library to register, model path or bytes) for a provider."""
    from dflash_trt.decoding.kernels.plugin import ort_python_op

    if provider not in ("auto", "library", "python"):
        raise DFlashError(f"unknown onnx custom-op provider {provider!r} (auto, library, python)")
    if provider in ("auto", "library"):
        library = ort_library()
        if library is not None:
            return str(library), str(onnx_path)
        if provider == "library":
            raise DFlashError("the plugin's onnxruntime custom-op library is not built: `make plugins "
                              "ONNXRUNTIME_ROOT=<dir with onnxruntime_c_api.h>`")
    if not ort_python_op.available():
        raise DFlashError("the onnx runtime needs the plugin's onnxruntime custom-op library or the "
                          "onnxruntime-extensions package")
    # Without the C++ library: the same CPU twin through onnxruntime-extensions' Python op.
    return ort_python_op.library_path(), ort_python_op.retarget_model(onnx_path)


def load_onnx_drafter(drafter_dir: str | Path, dtype: torch.dtype = torch.float32,
                      onnx_path: str | Path | None = None) -> OnnxDrafter:
    """Export the drafter at drafter_dir (unless onnx_path names an existing export) and open it with onnxruntime."""
    from dflash_trt.decoding.model.config import CONFIG_NAME
    from dflash_trt.decoding.model.drafters import load_drafter
    from dflash_trt.decoding.model.drafters.support import check_runtime
    from dflash_trt.decoding.model.exported.export import export_drafter

    if dtype == torch.bfloat16:
        raise DFlashError("the onnx runtime runs fp32 or fp16 drafters (numpy has no bfloat16)")
    check_runtime("onnx", DrafterConfig.from_file(Path(drafter_dir) / CONFIG_NAME))
    drafter = load_drafter(drafter_dir, dtype=dtype)
    if onnx_path is None or not Path(onnx_path).is_file():
        directory = Path(tempfile.mkdtemp(prefix="dflash-onnx-"))
        onnx_path = export_drafter(drafter, directory / "drafter.onnx")
    return OnnxDrafter(onnx_path, draft_head(drafter))
