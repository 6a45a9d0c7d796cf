"""`dflash-trt engine`: build an engine directory for a preset (the same as `make engine`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dflash_trt.engine.presets import DEFAULT_PRESET, GPUS, KV_DTYPES, MOE_BACKENDS, PROFILES, QUANTS, RUNTIMES
from dflash_trt.engine.speculative_config import add_speculative_config_option, apply_to_args


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "engine", help="build an engine directory for a model preset",
        description="Resolve the preset's checkpoints (never downloads), validate the pair, plan parallelism, "
                    "quantize, write the runtime's artifacts and manifest.json.")
    parser.add_argument("--model", default=DEFAULT_PRESET, help=f"preset name or .yaml file (default: {DEFAULT_PRESET})")
    add_layout_arguments(parser)
    parser.add_argument("--runtime", choices=RUNTIMES, help="runtime (default: the preset's)")
    parser.add_argument("--quant", choices=QUANTS, help="quantization (default: the preset's)")
    parser.add_argument("--out", type=Path, help="engine directory (default: engines/<preset>[-<setting>...])")
    parser.add_argument("--moe-backend", choices=MOE_BACKENDS,
                        help="trtllm MoE backend (default: the preset's; AUTO chooses per GPU, see engine/moe.py)")
    parser.add_argument("--profile", choices=PROFILES,
                        help="trtllm: NVIDIA's gpt-oss recipe settings for latency or throughput (default: the preset's)")
    parser.add_argument("--kv-block-reuse", action=argparse.BooleanOptionalAction, default=None,
                        help="trtllm: reuse KV-cache blocks of shared prompt prefixes (default: the preset's, off: "
                             "a reused prefix gives the drafter no hidden states; check the canary if on)")
    parser.add_argument("--target-weights", choices=("auto", "float"), default="auto",
                        help="auto (default): a .gguf target runs at the GGUF's own precision on CPU (torch/onnx "
                             "runtime, float32); float: the dequantized float target")
    add_checkpoint_arguments(parser)
    add_speculative_config_option(parser)
    parser.add_argument("--dry-run", action="store_true", help="print the plan and touch nothing")
    parser.set_defaults(func=run)


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tp", type=int, help="tensor-parallel size (default: the preset's)")
    parser.add_argument("--ep", type=int, help="expert-parallel size for MoE targets (default: the preset's)")
    parser.add_argument("--gpu", choices=GPUS, help="GPU the plan budgets for (default: the preset's)")
    parser.add_argument("--kv-dtype", choices=KV_DTYPES, help="KV-cache dtype (default: the preset's)")
    parser.add_argument("--memory-fraction", type=float,
                        help="fraction of free GPU memory given to the KV cache (default: the preset's)")


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoints-dir", type=Path,
                        help="where downloaded checkpoints live (<dir>/<org>/<name>), besides the HF cache")
    parser.add_argument("--target", type=Path, help="target checkpoint directory or .gguf file (overrides the preset)")
    parser.add_argument("--drafter", type=Path, help="drafter checkpoint directory (overrides the preset)")


def run(args: argparse.Namespace) -> int:
    from dflash_trt.engine.build import BuildRequest, build_engine

    apply_to_args(args, block_size_attr=None)  # --speculative-config sets --drafter and args.speculative
    spec = getattr(args, "speculative", None)
    build_engine(BuildRequest(
        model=args.model, tp=args.tp, ep=args.ep, runtime=args.runtime, quant=args.quant, kv_dtype=args.kv_dtype,
        gpu=args.gpu, memory_fraction=args.memory_fraction, out=args.out, target=args.target, drafter=args.drafter,
        checkpoints_dir=args.checkpoints_dir, dry_run=args.dry_run, block_size=spec.block_size if spec else None,
        moe_backend=args.moe_backend, profile=args.profile, kv_block_reuse=args.kv_block_reuse,
        target_weights=args.target_weights),
        log=lambda line: print(line, flush=True))
    return 0
