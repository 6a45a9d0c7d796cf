"""`dflash-trt engine`: resolve -> validate -> plan -> quantize -> runtime artifacts -> manifest.

Every step prints progress and is idempotent (an unchanged step is skipped on the next run). A step this
machine cannot run (no GPU, TensorRT or TensorRT-LLM) is recorded; everything else is still built, the
manifest lists the pending steps, and the build ends with one error line naming what is missing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.decoding.model.drafters.support import check_runtime
from dflash_trt.decoding.step.tree_budget import verification_methods
from dflash_trt.engine import steps
from dflash_trt.engine.arch import TargetArch, read_target_arch
from dflash_trt.engine.artifacts import drafter_onnx, trtllm
from dflash_trt.engine.compat import check_compatible
from dflash_trt.engine.manifest import MANIFEST_NAME, EngineError, write_manifest
from dflash_trt.engine.moe import resolve_moe
from dflash_trt.engine.planner import Plan, format_plan, plan_parallelism
from dflash_trt.engine.presets import DEFAULT_PRESET, REPO_ROOT, Preset, load_preset, preset_names
from dflash_trt.engine.quantize import QUANT_STATE_NAME, check_quant, quant_scheme
from dflash_trt.engine.resolve import ResolvedCheckpoint, resolve_checkpoint, resolve_for_planning
from dflash_trt.errors import ConfigError

NUM_STEPS = 6
SINGLE_DEVICE_RUNTIMES = ("torch", "onnx", "tensorrt")


@dataclass
class BuildRequest:
    """What the user asked for; None keeps the preset's value."""

    model: str = DEFAULT_PRESET
    tp: int | None = None
    ep: int | None = None
    runtime: str | None = None
    quant: str | None = None
    kv_dtype: str | None = None
    gpu: str | None = None
    memory_fraction: float | None = None
    out: Path | None = None
    target: Path | None = None
    drafter: Path | None = None
    checkpoints_dir: Path | None = None
    dry_run: bool = False
    block_size: int | None = None  # --speculative-config's num_speculative_tokens + 1
    moe_backend: str | None = None
    profile: str | None = None
    kv_block_reuse: bool | None = None  # trtllm: KV-cache block reuse (None: the preset's)
    target_weights: str = "auto"  # "auto": a GGUF target runs at its own precision on CPU; "float": dequantized


@dataclass
class BuildResult:
    engine_dir: Path
    preset: Preset
    plan: Plan
    warnings: list[str] = field(default_factory=list)
    manifest: dict[str, Any] | None = None  # None for a dry run
    pending: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # dry run: the checkpoints still to download


@dataclass
class _Pair:
    target: ResolvedCheckpoint
    drafter: ResolvedCheckpoint
    arch: TargetArch
    drafter_config: DrafterConfig


def build_engine(request: BuildRequest, log: Callable[[str], None] = print) -> BuildResult:
    """Build (or, with dry_run, only plan) the engine for a preset. Raises DFlashError on failure."""
    preset = _preset(request)
    engine_dir = Path(request.out) if request.out else default_engine_dir(preset, request)
    progress = steps.Progress(NUM_STEPS, log)

    progress.step("resolve checkpoints")
    pair, missing = _resolve(preset, request, log)
    preset = resolve_moe(preset, pair.arch, log)  # the MoE backend and EP for the GPU (engine/moe.py)
    progress.step("validate the pair")
    warnings = _validate(preset, pair, log)
    progress.step("plan parallelism")
    plan = plan_parallelism(preset.name, pair.arch, pair.drafter_config, preset.tp, preset.ep, preset.gpu,
                            preset.kv_dtype, preset.memory_fraction, preset.dtype, preset.quant, preset.max_seq_len)
    for line in format_plan(plan).splitlines():
        log("  " + line)
    if request.dry_run:
        _describe_rest(preset, engine_dir, progress, missing)
        return BuildResult(engine_dir, preset, plan, warnings, missing=missing)

    engine_dir.mkdir(parents=True, exist_ok=True)
    (engine_dir / MANIFEST_NAME).unlink(missing_ok=True)  # the engine is unusable until the build completes
    pending = steps.Pending()
    artifacts = _build_runtime(preset, pair, engine_dir, progress, pending)
    progress.step("write manifest.json")
    manifest = write_manifest(engine_dir, _manifest_fields(preset, pair, plan, warnings, artifacts, pending,
                                                                 request.target_weights))
    log(f"  {engine_dir / MANIFEST_NAME} ({len(manifest['files'])} files hashed)")
    error = pending.first_error()
    if error is not None:
        raise error
    log(f"engine ready: {engine_dir}")
    return BuildResult(engine_dir, preset, plan, warnings, manifest, pending.items)


def ensure_engine(engine_dir: str | Path, log: Callable[[str], None] = print) -> Path:
    """An engine to run: engine_dir when it is built. The default engine (engines/<default preset>) is
    built on first use, as `make demo` does; any other missing engine is one error naming the command."""
    engine_dir = Path(engine_dir)
    if (engine_dir / MANIFEST_NAME).is_file():
        return engine_dir
    default = BuildRequest()
    if engine_dir.resolve() == default_engine_dir(_preset(default), default).resolve():
        log(f"{engine_dir} is not built yet: building the default engine first (as `make demo` does)")
        return build_engine(default, log=log).engine_dir
    model = engine_dir.name if engine_dir.name in preset_names() else "<preset>"
    raise EngineError(f"{engine_dir}: no {MANIFEST_NAME}, not a built engine; build it with "
                      f"`dflash-trt engine --model {model} --out {engine_dir}`")


def default_engine_dir(preset: Preset, request: BuildRequest) -> Path:
    """engines/<preset>, with a suffix for each build setting that differs from the preset's."""
    base = load_preset(request.model)
    name = preset.name
    if preset.runtime != base.runtime:
        name += f"-{preset.runtime}"
    if preset.tp != base.tp:
        name += f"-tp{preset.tp}"
    if preset.quant != base.quant:
        name += f"-{preset.quant}"
    if preset.block_size != base.block_size:
        name += f"-b{preset.block_size}"
    return REPO_ROOT / "engines" / name


def _preset(request: BuildRequest) -> Preset:
    preset = load_preset(request.model).with_overrides(
        tp=request.tp, ep=request.ep, runtime=request.runtime, quant=request.quant, kv_dtype=request.kv_dtype,
        gpu=request.gpu, memory_fraction=request.memory_fraction, block_size=request.block_size,
        moe_backend=request.moe_backend, profile=request.profile, kv_block_reuse=request.kv_block_reuse)
    if preset.runtime in SINGLE_DEVICE_RUNTIMES and preset.tp > 1:
        raise ConfigError(f"runtime {preset.runtime} runs the target on one device; TP={preset.tp} needs "
                          "--runtime trtllm")
    return preset


def _resolve(preset: Preset, request: BuildRequest, log: Callable[[str], None]) -> tuple[_Pair, list[str]]:
    """The pair, and (dry runs only) what a build would still have to download.

    A dry run reads configs only: a checkpoint that is not here is planned from its published config."""
    found, missing = {}, []
    for role, spec, override in (("target", preset.target, request.target),
                                 ("drafter", preset.drafter, request.drafter)):
        if request.dry_run:
            found[role], lacking = resolve_for_planning(role, spec, override, request.checkpoints_dir)
            missing += [lacking] if lacking else []
        else:
            found[role] = resolve_checkpoint(role, spec, override, request.checkpoints_dir)
        log(f"  {role}: {spec.id} -> {found[role].path} ({found[role].found_in})")
    target, drafter = found["target"], found["drafter"]
    pair = _Pair(target, drafter, read_target_arch(target.path), DrafterConfig.from_file(drafter.path / "config.json"))
    return pair, missing


def _validate(preset: Preset, pair: _Pair, log: Callable[[str], None]) -> list[str]:
    check_quant(preset.quant, pair.arch, preset.runtime, preset.target.id)
    warnings = check_compatible(pair.arch, pair.drafter_config, preset.block_size,
                                f"{preset.drafter.id} with {preset.target.id}", preset.max_seq_len)
    d = pair.drafter_config
    check_runtime(preset.runtime, d)
    if preset.runtime in ("onnx", "tensorrt") and preset.block_size != d.block_size:
        raise ConfigError(f"runtime {preset.runtime} exports the drafter with its trained block of {d.block_size}; "
                          f"block_size {preset.block_size} needs --runtime torch or trtllm")
    log(f"  compatible: {d.architecture}, vocabulary {d.vocab_size}, hidden {d.hidden_size}, "
        f"{d.num_target_layers} target layers, layer ids {list(d.target_layer_ids)}, mask token {d.mask_token_id}, "
        f"block {preset.block_size}")
    for warning in warnings:
        log(f"  warning: {warning}")
    return warnings


def _describe_rest(preset: Preset, engine_dir: Path, progress: steps.Progress, missing: list[str]) -> None:
    progress.step(f"prepare the target, quantize ({preset.quant})")
    progress.step(f"write {preset.runtime} artifacts")
    for name in _planned_outputs(preset):
        progress.log(f"  would write {engine_dir / name}")
    progress.step("write manifest.json")
    progress.log(f"  would write {engine_dir / MANIFEST_NAME}")
    if missing:
        progress.log(f"missing before a build ({len(missing)}):")
        for line in missing:
            progress.log(f"  {line}")
    else:
        progress.log("every checkpoint is here")
    progress.log("dry run: nothing was written")


def _planned_outputs(preset: Preset) -> list[str]:
    if preset.runtime == "trtllm":
        return ["target (link)", "drafter (link)", trtllm.OPTIONS_NAME]
    outputs = ["target/", "drafter/"]
    if preset.quant in ("fp8", "nvfp4"):
        outputs.append(QUANT_STATE_NAME)
    if preset.runtime in ("onnx", "tensorrt"):
        outputs.append(drafter_onnx.ONNX_NAME)
    if preset.runtime == "tensorrt":
        outputs.append(drafter_onnx.PLAN_NAME)
    return outputs


def _build_runtime(preset: Preset, pair: _Pair, engine_dir: Path, progress: steps.Progress,
                   pending: steps.Pending) -> dict[str, str]:
    if preset.runtime == "trtllm":
        from dflash_trt.engine.build_trtllm import build_trtllm

        return build_trtllm(preset, pair, engine_dir, progress, pending)
    from dflash_trt.engine.build_local import build_local

    return build_local(preset, pair, engine_dir, progress, pending)


def target_weights(pair: _Pair, preset: Preset, requested: str) -> str:
    """"gguf" when the torch runtime loads a GGUF target at its shipped precision on CPU (the source GGUF, with
    the block-quantized kernels; see docs/quantized-cpu.md), else "float" (the dequantized target/ directory)."""
    if requested not in ("auto", "float"):
        raise EngineError(f"target weights must be auto or float, got {requested!r}")
    shipped = (pair.target.is_gguf and preset.runtime in ("torch", "onnx") and preset.dtype == "float32"
               and preset.quant == "none")
    return "gguf" if shipped and requested == "auto" else "float"


def _manifest_fields(preset: Preset, pair: _Pair, plan: Plan, warnings: list[str], artifacts: dict[str, str],
                     pending: steps.Pending, request_weights: str = "auto") -> dict[str, Any]:
    d = pair.drafter_config
    return {
        "name": preset.name,
        "runtime": preset.runtime,
        "preset": {"name": preset.name, "source": preset.source, **{k: v for k, v in asdict(preset).items()
                                                                    if k not in ("name", "source")}},
        "target": {"id": preset.target.id, "source": str(pair.target.path), "path": "target",
                   "weights": target_weights(pair, preset, request_weights)},
        "drafter": {"id": preset.drafter.id, "source": str(pair.drafter.path), "path": "drafter"},
        "tp": preset.tp,
        "ep": preset.ep,
        "dtype": preset.dtype,
        "quant": preset.quant,
        "quant_scheme": quant_scheme(preset.quant, preset.runtime, preset.dtype),
        "kv_dtype": preset.kv_dtype,
        "block_size": preset.block_size,
        "max_draft_len": preset.max_draft_len,
        "verification": verification_methods(preset.runtime),  # the repository's tree_budget needs "tree"
        "drafter_family": d.family,
        "drafter_architecture": d.architecture,
        "target_layer_ids": list(d.target_layer_ids),
        "mask_token_id": d.mask_token_id,
        "num_target_layers": d.num_target_layers,
        "artifacts": artifacts,
        "plan": {"gpu": plan.gpu.name, "kv_budget_bytes": int(plan.kv_budget), "kv_bytes_per_token": plan.kv_per_token,
                 "drafter_kv_bytes_per_token": plan.drafter_kv_per_token, "max_tokens_in_flight": plan.max_tokens},
        "warnings": warnings,
        "pending_steps": pending.items,
    }
