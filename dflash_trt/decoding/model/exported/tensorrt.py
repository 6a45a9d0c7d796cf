"""The `tensorrt` runtime's drafter: drafter.plan (trtexec, with the plugin library) run by TensorRT's Python API.

`TensorRTDrafter` implements protocols.Drafter like `OnnxDrafter`, with the drafter's host part (exported.head)
in torch on the same device. The cache is a ContextCache of tensors on the device; the plugin's cache outputs are
bound to the same memory as its cache inputs, so with aliased plugin I/O (trtexec
--preview=+aliasedPluginIO1003, which the engine builder passes) a call updates them in place and copies nothing.
It runs on torch's current stream with execute_async_v3.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dflash_trt.decoding.model.context_cache import ContextCache
from dflash_trt.decoding.model.drafters import DrafterBase
from dflash_trt.decoding.model.exported.export import cache_names
from dflash_trt.decoding.model.exported.head import ExportedDrafter
from dflash_trt.errors import DFlashError

INPUTS = ("block_embeds", "features", "cache_lens", "ctx_lens")


def _torch_dtype(trt, trt_type) -> torch.dtype:
    types = {trt.DataType.FLOAT: torch.float32, trt.DataType.HALF: torch.float16, trt.DataType.BF16: torch.bfloat16,
             trt.DataType.INT32: torch.int32}
    if trt_type not in types:
        raise DFlashError(f"drafter.plan: unsupported tensor type {trt_type}")
    return types[trt_type]


class TensorRTDrafter(ExportedDrafter):
    """A drafter engine (drafter.plan) with the DFlashAttention plugin, run by TensorRT on one device."""

    def __init__(self, plan_path: str | Path, head: DrafterBase, plugin_library: str | Path | None = None,
                 device: torch.device | str = "cuda"):
        """head: the drafter's host part (exported.head.load_draft_head of its directory, on `device`)."""
        try:
            import tensorrt as trt
        except ImportError:
            raise DFlashError("the tensorrt runtime needs TensorRT's Python package (`tensorrt`)") from None
        from dflash_trt.decoding.kernels.plugin.build import TRT_TARGET, library_path

        library = Path(plugin_library) if plugin_library else library_path(TRT_TARGET)
        if not library.is_file():
            raise DFlashError(f"the TensorRT plugin library {library} is missing (`make plugins TENSORRT_ROOT=...`)")
        self._trt = trt
        self._logger = trt.Logger(trt.Logger.WARNING)
        trt.get_plugin_registry().load_library(str(library))
        self._runtime = trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(Path(plan_path).read_bytes())
        if self.engine is None:
            raise DFlashError(f"{plan_path}: TensorRT could not deserialize the drafter engine")
        self.context = self.engine.create_execution_context()
        self.head = head
        self.device = torch.device(device)
        self.dtype = _torch_dtype(trt, self.engine.get_tensor_dtype("block_embeds"))
        self._cache_inputs = cache_names(head.config.num_hidden_layers)
        self._cache_outputs = cache_names(head.config.num_hidden_layers, "_out")

    def new_cache(self, batch_size: int, capacity: int) -> ContextCache:
        windows = [None] * self.config.num_hidden_layers  # the engine attends to every context row
        return ContextCache(self.config, batch_size, capacity, self.dtype, self.device, windows)

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0

    def __call__(self, block_embeds: torch.Tensor, features: torch.Tensor, ctx_lens: torch.Tensor,
                 cache: ContextCache) -> torch.Tensor:
        """One draft forward (same contract as DFlashDrafter.forward); returns hidden [B,S,D] in the engine dtype."""
        if cache.capacity < int((cache.lens + ctx_lens.to(cache.lens.device)).max()):
            raise ValueError("draft cache too small for the context")
        batch, block, hidden_size = block_embeds.shape
        feeds = {"block_embeds": block_embeds.to(self.device, self.dtype).contiguous(),
                 "features": features.to(self.device, self.dtype).contiguous(),
                 "cache_lens": cache.lens.to(self.device, torch.int32),
                 "ctx_lens": ctx_lens.to(self.device, torch.int32)}
        caches = [t for pair in zip(cache.k, cache.v) for t in pair]
        hidden = torch.empty(batch, block, hidden_size, dtype=self.dtype, device=self.device)
        for name, tensor in [*feeds.items(), *zip(self._cache_inputs, caches)]:
            self.context.set_input_shape(name, tuple(tensor.shape))
            self.context.set_tensor_address(name, tensor.data_ptr())
        self.context.set_tensor_address("hidden", hidden.data_ptr())
        for name, tensor in zip(self._cache_outputs, caches):  # in place: outputs bound to the inputs' memory
            self.context.set_tensor_address(name, tensor.data_ptr())
        if not self.context.execute_async_v3(self._stream()):
            raise DFlashError("TensorRT failed to run the drafter engine")
        cache.lens = cache.lens + ctx_lens.to(cache.lens.device)
        return hidden
