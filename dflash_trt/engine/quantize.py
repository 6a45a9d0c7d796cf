"""Target quantization with NVIDIA ModelOpt.

fp8 (torch/onnx/tensorrt runtimes): ModelOpt's FP8 recipe for the weights (per-tensor E4M3, calibrated on
a few prompts), activations left in the model dtype. Activation fake-quantization turns the float noise
between a verify block and a one-token step into whole FP8 rounding steps, which breaks the exact greedy
equality these runtimes guarantee (on the demo pair W8A8 diverged after 28 tokens; weights-only matched).
The engine stores ModelOpt's state (quantizer placement and ranges, a few hundred KB) next to the weights
and load_engine restores it, so the engine runs exactly the quantized model. The drafter is not quantized:
it is small, and DFlash stays lossless against the quantized target either way.
nvfp4: ModelOpt needs CUDA for it. mxfp4: gpt-oss checkpoints ship their experts in MXFP4; they are kept
as shipped (nothing to do), and no other target can be turned into MXFP4 here.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable

from dflash_trt.engine.arch import TargetArch
from dflash_trt.engine.needs import StepUnavailable, has_cuda
from dflash_trt.errors import ConfigError

QUANT_STATE_NAME = "quantization/modelopt_state.pth"  # relative to the engine directory
CALIBRATION_PROMPTS = (
    "Explain why the sky is blue in two sentences.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "A train travels 60 km in 45 minutes. What is its average speed in km/h?",
    "List three uses of a paperclip.",
    "Translate 'good morning, friends' into French.",
    "What is the difference between a list and a tuple in Python?",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
    "If x + 3 = 10, what is 2x?",
)


def quant_scheme(quant: str, runtime: str, dtype: str) -> str:
    """One line for the manifest: what the engine's weights and activations are stored/computed in."""
    if quant == "none":
        return f"{dtype} weights and activations"
    if quant == "mxfp4":
        return f"MXFP4 experts as shipped, other weights {dtype}"
    if runtime == "trtllm":
        return f"{quant} weights and activations (a ModelOpt checkpoint for TensorRT-LLM)"
    return f"{quant} weights (ModelOpt, restored at load), activations {dtype}"


def check_quant(quant: str, arch: TargetArch, runtime: str, target_name: str) -> None:
    """Reject a quantization the target or runtime cannot take, before anything is built."""
    if quant == "mxfp4" and arch.quant_method != "mxfp4":
        raise ConfigError(f"quant mxfp4 keeps a checkpoint's MXFP4 experts as shipped, and {target_name} has none "
                          f"(its quant_method is {arch.quant_method or 'none'}); use fp8 or nvfp4")
    if quant in ("fp8", "nvfp4") and arch.quant_method == "mxfp4":
        raise ConfigError(f"{target_name} ships MXFP4 experts; requantizing them to {quant} is not supported, "
                          "use quant mxfp4 (as shipped)")


def quantize_target(quant: str, runtime: str, target_dir: Path, state_path: Path, dtype: str,
                    log: Callable[[str], None]) -> Path | None:
    """Calibrate the target in `target_dir`; the result goes to `state_path`: ModelOpt's state file for the
    local runtimes, a quantized checkpoint directory for trtllm. The target's own files are never modified
    (it may be a link into a shared checkpoint). Returns what was written, if anything."""
    if quant in ("none", "mxfp4"):
        log("  nothing to do" if quant == "none" else "  MXFP4 experts kept as shipped")
        return None
    if quant == "nvfp4" and not has_cuda():
        raise StepUnavailable("quantize", "a CUDA GPU (ModelOpt computes NVFP4 scales on the GPU)")
    state_path.parent.mkdir(parents=True, exist_ok=True)
    if runtime == "trtllm":
        return export_for_trtllm(quant, target_dir, state_path, dtype, log)
    return _fake_quantize(quant, target_dir, state_path, dtype, log)


def export_for_trtllm(quant: str, target_dir: Path, out_dir: Path, dtype: str, log: Callable[[str], None]) -> Path:
    """Calibrate on the GPUs (weights and activations) and write the ModelOpt-quantized Hugging Face
    checkpoint that TensorRT-LLM loads; a large target is spread over every visible GPU."""
    if not has_cuda():
        raise StepUnavailable("quantize", f"CUDA GPUs (ModelOpt calibrates {quant} for TensorRT-LLM on them)")
    import shutil

    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import AutoModelForCausalLM

    from dflash_trt.decoding.model.target import load_tokenizer

    tokenizer = load_tokenizer(target_dir)
    if tokenizer is None:
        raise ConfigError(f"{target_dir}: calibration needs the target's tokenizer, and none was found")
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=getattr(torch, dtype), device_map="auto")

    def calibrate(m):
        with torch.inference_mode():
            for prompt in CALIBRATION_PROMPTS:
                m(tokenizer(prompt, return_tensors="pt").input_ids.to(m.device))

    log(f"  ModelOpt {quant}: calibrating on {len(CALIBRATION_PROMPTS)} prompts, exporting for TensorRT-LLM")
    config = {"fp8": mtq.FP8_DEFAULT_CFG, "nvfp4": mtq.NVFP4_DEFAULT_CFG}[quant]
    model = mtq.quantize(model, config, calibrate)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    export_hf_checkpoint(model, export_dir=tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out_dir)
    return out_dir


def _fake_quantize(quant: str, target_dir: Path, state_path: Path, dtype: str, log: Callable[[str], None]) -> Path:
    import modelopt.torch.opt as mto
    import modelopt.torch.quantization as mtq
    import torch

    from dflash_trt.decoding.model.target import load_target

    # NVFP4 scales are computed by CUDA kernels; FP8 calibrates anywhere.
    device = "cuda" if quant == "nvfp4" else "cpu"
    target = load_target(target_dir, dtype=getattr(torch, dtype), device=device, pack=False)  # ModelOpt: exact nn.Linear
    if target.tokenizer is None:
        raise ConfigError(f"{target_dir}: calibration needs the target's tokenizer, and none was found")
    config = copy.deepcopy({"fp8": mtq.FP8_DEFAULT_CFG, "nvfp4": mtq.NVFP4_DEFAULT_CFG}[quant])
    config["quant_cfg"].append({"quantizer_name": "*input_quantizer", "enable": False})  # weights only (see above)

    def calibrate(model):
        with torch.inference_mode():
            for prompt in CALIBRATION_PROMPTS:
                model(target.tokenizer(prompt, return_tensors="pt").input_ids.to(target.device))

    log(f"  ModelOpt {quant} weights: calibrating on {len(CALIBRATION_PROMPTS)} prompts")
    model = mtq.quantize(target.model, config, calibrate)
    state = {"modelopt_state": mto.modelopt_state(model),
             "quantizers": {k: v for k, v in model.state_dict().items() if "_quantizer." in k}}
    state_path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, state_path)
    return state_path


def restore_quantization(model, state_path: Path):
    """Re-apply a saved ModelOpt state to a freshly loaded target model; returns the quantized model."""
    import modelopt.torch.opt as mto
    import torch

    state = torch.load(state_path, weights_only=False)  # written by this builder, verified by the manifest
    model = mto.restore_from_modelopt_state(model, state["modelopt_state"])
    result = model.load_state_dict(state["quantizers"], strict=False)
    if result.unexpected_keys:
        raise ConfigError(f"{state_path}: quantizer state does not fit the target ({result.unexpected_keys[0]})")
    return model.eval()
