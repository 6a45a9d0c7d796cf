"""The `onnx` runtime's drafter: the exported graph run by onnxruntime with the plugin's custom-op library.

`OnnxDrafter` offers what the decoding loop uses of the PyTorch drafter (config, new_cache, propose), so
`generate(target, OnnxDrafter(...), ...)` runs the same loop; the drafter's host part (embeddings in, draft
choice out: plugin.draft_head) runs in torch. Graph values are fp32 or fp16 (numpy has no bf16).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..config import DrafterConfig
from ..drafters import DrafterBase
from ..errors import DFlashError
from .draft_head import ExportedDrafter, draft_head
from .export import cache_names
from .onnx_node import ort_library

_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class OnnxDraftCache:
    """Context K/V of every draft layer as numpy arrays [B, Hkv, capacity, Dh], plus lens [B] (int64 tensor)."""

    def __init__(self, config: DrafterConfig, batch_size: int, capacity: int, dtype: type):
        shape = (batch_size, config.num_key_value_heads, capacity, config.head_dim)
        self.k = [np.zeros(shape, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.v = [np.zeros(shape, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.lens = torch.zeros(batch_size, dtype=torch.int64)

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2] if self.k else 0

    def select(self, indices: torch.Tensor) -> None:
        """Keep only the sequences at `indices` (finished sequences leave the batch)."""
        rows = indices.cpu().numpy()
        self.k = [a[rows] for a in self.k]
        self.v = [a[rows] for a in self.v]
        self.lens = self.lens[indices.cpu()]

    def part(self, indices: torch.Tensor) -> "OnnxDraftCache":
        """A copy holding the sequences at `indices` only (write it back with `update`)."""
        part = copy.copy(self)
        part.select(indices)
        return part

    def update(self, indices: torch.Tensor, part: "OnnxDraftCache") -> None:
        rows = indices.cpu().numpy()
        for whole, new in zip(self.k + self.v, part.k + part.v):
            whole[rows] = new
        self.lens[indices.cpu()] = part.lens


class OnnxDrafter(ExportedDrafter):
    """A drafter ONNX file (dflash_trt.plugin.export) run by onnxruntime on CPU."""

    def __init__(self, onnx_path: str | Path, head: DrafterBase, provider: str = "auto"):
        """head: the drafter's host part (plugin.draft_head.load_draft_head of its directory).

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

    def new_cache(self, batch_size: int, capacity: int) -> OnnxDraftCache:
        return OnnxDraftCache(self.config, batch_size, capacity, self.dtype)

    def __call__(self, block_embeds: torch.Tensor, features: torch.Tensor, ctx_lens: torch.Tensor,
                 cache: OnnxDraftCache) -> torch.Tensor:
        """One draft forward (same contract as DFlashDrafter.forward); returns hidden [B,S,D] as a tensor."""
        if cache.capacity < int((cache.lens + ctx_lens.cpu()).max()):
            raise ValueError("draft cache too small for the context")
        feeds = {
            "block_embeds": block_embeds.detach().cpu().numpy().astype(self.dtype, copy=False),
            "features": features.detach().cpu().numpy().astype(self.dtype, copy=False),
            "cache_lens": cache.lens.numpy().astype(np.int32),
            "ctx_lens": ctx_lens.cpu().numpy().astype(np.int32),
        }
        caches = [a for pair in zip(cache.k, cache.v) for a in pair]
        feeds.update(zip(self._cache_inputs, caches))
        hidden, *new_caches = self.session.run(None, feeds)
        cache.k, cache.v = new_caches[0::2], new_caches[1::2]
        cache.lens = cache.lens + ctx_lens.cpu()
        return torch.from_numpy(hidden).to(block_embeds.dtype)


def _custom_op(onnx_path: str | Path, provider: str) -> tuple[str, str | bytes]:
    """(custom-op library to register, model path or bytes) for a provider."""
    from . import ort_python_op

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
    from ..config import CONFIG_NAME
    from ..drafter import load_drafter
    from ..drafters.support import check_runtime
    from .export import export_drafter

    if dtype == torch.bfloat16:
        raise DFlashError("the onnx runtime runs fp32 or fp16 drafters (numpy has no bfloat16)")
    check_runtime("onnx", DrafterConfig.from_file(Path(drafter_dir) / CONFIG_NAME))
    drafter = load_drafter(drafter_dir, dtype=dtype)
    if onnx_path is None or not Path(onnx_path).is_file():
        directory = Path(tempfile.mkdtemp(prefix="dflash-onnx-"))
        onnx_path = export_drafter(drafter, directory / "drafter.onnx")
    return OnnxDrafter(onnx_path, draft_head(drafter))
