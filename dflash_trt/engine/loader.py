"""load_engine: the one way runtimes, Triton models and benchmarks open an engine directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.engine.manifest import EngineError, read_manifest


@dataclass
class Engine:
    """An engine's manifest plus what its runtime needs (models are loaded only for local runtimes)."""

    directory: Path
    manifest: dict[str, Any]
    drafter_config: DrafterConfig
    target: Any = None  # dflash_trt.decoding.model.target.TargetModel (torch, onnx, tensorrt)
    drafter: Any = None  # DFlashDrafter (torch), OnnxDrafter (onnx) or TensorRTDrafter (tensorrt, on CUDA): one API
    drafter_onnx: Path | None = None  # onnx, tensorrt
    tensorrt_plan: Path | None = None  # tensorrt
    llm_options: dict[str, Any] | None = None  # trtllm: LLM(**llm_options), "model" included

    @property
    def runtime(self) -> str:
        return self.manifest["runtime"]

    @property
    def block_size(self) -> int:
        return self.manifest["block_size"]

    @property
    def target_path(self) -> Path:
        return self.directory / self.manifest["target"]["path"]

    @property
    def drafter_path(self) -> Path:
        return self.directory / self.manifest["drafter"]["path"]


def load_engine(engine_dir: str | Path, verify: bool = True, load_models: bool = True,
                device: str = "cpu") -> Engine:
    """Verify an engine's files against its manifest and load what its runtime needs.

    verify=False skips hashing (only for callers that just verified the same directory).
    load_models=False returns the manifest, paths and drafter config without loading weights.
    """
    engine_dir = Path(engine_dir)
    manifest = read_manifest(engine_dir, verify=verify)
    blocking = [p for p in manifest.get("pending_steps", []) if p.get("blocking")]
    if blocking:
        raise EngineError(f"{engine_dir}: incomplete {manifest['runtime']} engine, {blocking[0]['message']}")
    artifacts = manifest.get("artifacts", {})
    engine = Engine(engine_dir, manifest, DrafterConfig.from_file(engine_dir / manifest["drafter"]["path"] /
                                                                    "config.json"))
    if "drafter_onnx" in artifacts:
        engine.drafter_onnx = engine_dir / artifacts["drafter_onnx"]
    if "tensorrt_plan" in artifacts:
        engine.tensorrt_plan = engine_dir / artifacts["tensorrt_plan"]
    if engine.runtime == "trtllm":
        engine.llm_options = _llm_options(engine)
    elif load_models:
        _load_models(engine, device)
    return engine


def _load_models(engine: Engine, device: str) -> None:
    import torch

    from dflash_trt.decoding.model.drafters import load_drafter
    from dflash_trt.decoding.model.drafters.int8_weights import apply_drafter_weights
    from dflash_trt.decoding.model.target import load_target

    dtype = getattr(torch, engine.manifest["dtype"])
    if engine.manifest.get("quant") == "nvfp4" and not str(device).startswith("cuda"):
        raise EngineError(f"{engine.directory}: an nvfp4 engine runs on a CUDA device; load it with device='cuda'")
    state = engine.manifest.get("artifacts", {}).get("quantization")
    target = engine.manifest["target"]
    if target.get("weights") == "gguf" and str(device) == "cpu":
        # The GGUF's blocks as it ships them (block-quantized kernels); the rest (embeddings, norms, config,
        # tokenizer) from the dequantized target/ directory, which loads much faster than the GGUF's metadata parses.
        gguf = Path(target["source"])
        if not gguf.is_file():
            raise EngineError(f"{engine.directory}: its target GGUF {gguf} is gone; rebuild the engine (or build it "
                              "with --target-weights float)")
        engine.target = load_target(engine.target_path, dtype=dtype, device=device, weights="gguf", blocks_from=gguf)
    else:
        # A quantized target keeps plain nn.Linear modules: ModelOpt converts them by exact type.
        engine.target = load_target(engine.target_path, dtype=dtype, device=device, pack=not state)
    if state:
        from dflash_trt.engine.quantize import restore_quantization

        restore_quantization(engine.target.model, engine.directory / state)
    if engine.runtime == "torch":
        engine.drafter = load_drafter(engine.drafter_path, dtype=dtype, device=device)
        apply_drafter_weights("auto", engine.target, engine.drafter)  # Q8_0 beside a GGUF-precision target
    elif engine.runtime == "onnx":
        from dflash_trt.decoding.model.exported.head import load_draft_head
        from dflash_trt.decoding.model.exported.onnx import OnnxDrafter

        engine.drafter = OnnxDrafter(engine.drafter_onnx, load_draft_head(engine.drafter_path, dtype))
    elif engine.runtime == "tensorrt" and engine.tensorrt_plan is not None and str(device).startswith("cuda"):
        from dflash_trt.decoding.model.exported.head import load_draft_head
        from dflash_trt.decoding.model.exported.tensorrt import \
            TensorRTDrafter  # TensorRT runs on a GPU only: off-GPU, no drafter

        engine.drafter = TensorRTDrafter(engine.tensorrt_plan, load_draft_head(engine.drafter_path, dtype, device),
                                         device=device)


def _llm_options(engine: Engine) -> dict[str, Any]:
    import yaml

    options = yaml.safe_load((engine.directory / engine.manifest["artifacts"]["trtllm_options"]).read_text())
    # target/ is a link to the checkpoint, or the quantized checkpoint the build wrote
    return {"model": str(engine.target_path.resolve()), **options}
