"""`dflash-trt plan`: divisibility checks and the per-GPU memory budget of a preset's pair."""

from __future__ import annotations

import argparse

from dflash_trt.commands.engine import add_checkpoint_arguments, add_layout_arguments
from dflash_trt.engine.presets import DEFAULT_PRESET


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan", help="check a parallel layout and print the per-GPU memory budget",
        description="Reads only config.json files: the local checkpoints when found, else the published configs "
                    "shipped with the presets (build/presets/configs), so a layout can be planned before any download.")
    parser.add_argument("--model", default=DEFAULT_PRESET, help=f"preset name or .yaml file (default: {DEFAULT_PRESET})")
    add_layout_arguments(parser)
    parser.add_argument("--seq-len", type=int, help="sequence length for tokens in flight (default: the preset's "
                                                    "max_seq_len)")
    add_checkpoint_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dflash_trt.decoding.model.config import DrafterConfig
    from dflash_trt.engine.arch import read_target_arch
    from dflash_trt.engine.moe import resolve_moe
    from dflash_trt.engine.planner import format_plan, plan_parallelism
    from dflash_trt.engine.presets import load_preset

    preset = load_preset(args.model).with_overrides(tp=args.tp, ep=args.ep, gpu=args.gpu, kv_dtype=args.kv_dtype,
                                                    memory_fraction=args.memory_fraction)
    target = _config_source("target", preset.target, args.target, args.checkpoints_dir)
    drafter = _config_source("drafter", preset.drafter, args.drafter, args.checkpoints_dir)
    arch = read_target_arch(target.path)
    preset = resolve_moe(preset, arch)  # the MoE rule may change EP (TRITON splits experts by EP only)
    plan = plan_parallelism(preset.name, arch, DrafterConfig.from_file(drafter.path /
                            "config.json"), preset.tp, preset.ep, preset.gpu, preset.kv_dtype, preset.memory_fraction,
                            preset.dtype, preset.quant, args.seq_len or preset.max_seq_len)
    print(format_plan(plan))
    return 0


def _config_source(role, spec, override, checkpoints_dir):
    """The checkpoint whose config.json to read: local first, then the config shipped with the preset."""
    from dflash_trt.engine.resolve import PUBLISHED_CONFIG, resolve_for_planning

    found, _missing = resolve_for_planning(role, spec, override, checkpoints_dir)
    if found.found_in == PUBLISHED_CONFIG:
        print(f"note: {role} {spec.id} not found locally; planning from its published config.json "
              f"(build/presets/configs/{spec.id})")
    return found
