"""Options shared by the commands that run a target with a drafter."""

from __future__ import annotations

import argparse

from dflash_trt.decoding.model.tokens import default_stop_ids
from dflash_trt.decoding.step.sampling import SamplingParams, bad_words_ids
from dflash_trt.engine.speculative_config import add_speculative_config_option, apply_to_args
from dflash_trt.errors import DFlashError


def int_list(text: str) -> list[int]:
    """Parse '1,2,3' into [1, 2, 3]."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def name_list(text: str) -> tuple[str, ...]:
    """Parse 'a, b,c' into ('a', 'b', 'c')."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="target model: Hugging Face directory or .gguf file")
    parser.add_argument("--drafter", help="DFlash drafter directory (omit for plain autoregressive decoding)")
    parser.add_argument("--block-size", type=int, help="tokens per draft block (default: the drafter's)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="compute dtype (default: float32, exact on CPU)")
    parser.add_argument("--weights", choices=("float", "gguf", "auto"), default="auto",
                        help="target weights: auto (default) = gguf for a .gguf target on CPU with --dtype float32, "
                             "else float; gguf = a .gguf target's linear layers at the GGUF's own precision "
                             "(block-quantized CPU kernels); float = dequantized to --dtype")
    parser.add_argument("--drafter-dtype", choices=("float32", "bfloat16", "float16"),
                        help="the drafter's compute dtype (default: --dtype); drafts are only proposals, so this "
                             "changes acceptance and speed, never the output")
    parser.add_argument("--drafter-weights", choices=("auto", "float", "q8_0"), default="auto",
                        help="the torch drafter's linear layers: auto (default) = q8_0 beside a target at its GGUF "
                             "precision (a float32 drafter on CPU), else float; q8_0 = int8 blocks (the target's "
                             "block kernels); drafts are only proposals, so this never changes the output")
    parser.add_argument("--chat", action="store_true", help="wrap text prompts in the tokenizer's chat template")
    parser.add_argument("--runtime", choices=("torch", "onnx"), default="torch",
                        help="drafter runtime: torch (default) or onnx (exported graph + plugin custom op)")
    add_speculative_config_option(parser)
    parser.add_argument("--tree-budget", type=int, default=0, metavar="B",
                        help="verify a tree of the drafter's B most probable continuations (0 = the chain, default)")
    parser.add_argument("--tree-top-k", type=int, metavar="K",
                        help="candidates per block slot of the tree (default: min(B, 8))")


def verify_method(args):
    """The verification method of --tree-budget / --tree-top-k (a one-line error for bad values)."""
    from dflash_trt.decoding.step.verify import tree_or_chain

    return tree_or_chain(args.tree_budget, args.tree_top_k)


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    defaults = SamplingParams()
    parser.add_argument("--max-new-tokens", type=int, required=True)
    parser.add_argument("--temperature", type=float, default=defaults.temperature, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=defaults.top_k, help="0 = off (default)")
    parser.add_argument("--top-p", type=float, default=defaults.top_p, help="1.0 = off (default)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--stop-ids", type=int_list,
                        help="stop token ids, e.g. 7,9; '' for none (default: the target's EOS)")
    add_logits_options(parser)


def add_logits_options(parser: argparse.ArgumentParser) -> None:
    """The logits processors of SamplingParams (semantics in dflash_trt/decoding/step/logits_processors.py)."""
    defaults = SamplingParams()
    parser.add_argument("--min-tokens", type=int, default=defaults.min_tokens, metavar="N",
                        help="the stop ids are masked until N tokens were generated (default: 0)")
    parser.add_argument("--bad-words", action="append", default=[], metavar="WORD",
                        help="text never to emit, tokenized without special tokens (repeatable)")
    parser.add_argument("--repetition-penalty", type=float, default=defaults.repetition_penalty, metavar="R",
                        help="> 0; divides the positive logits of prompt and output tokens (default: 1.0, off)")
    parser.add_argument("--presence-penalty", type=float, default=defaults.presence_penalty, metavar="A",
                        help="subtracted from tokens present in prompt + output (default: 0.0)")
    parser.add_argument("--frequency-penalty", type=float, default=defaults.frequency_penalty, metavar="F",
                        help="subtracted per occurrence in prompt + output (default: 0.0)")


def load_pair(args):
    """(TargetModel, drafter or None) from --target/--drafter."""
    import torch
    from transformers.utils import logging as hf_logging

    from dflash_trt.decoding.model.drafters import load_drafter
    from dflash_trt.decoding.model.drafters.int8_weights import apply_drafter_weights
    from dflash_trt.decoding.model.target import load_target

    hf_logging.disable_progress_bar()  # weight-loading bars are noise on a command line
    apply_to_args(args)  # --speculative-config sets --drafter and --block-size
    dtype = getattr(torch, args.dtype)
    target = load_target(args.target, dtype=dtype, weights=getattr(args, "weights", "float"))
    if args.drafter and getattr(args, "runtime", "torch") == "onnx":
        from dflash_trt.decoding.model.exported.onnx import load_onnx_drafter

        drafter = load_onnx_drafter(args.drafter, dtype=dtype)
    else:
        drafter_dtype = getattr(torch, getattr(args, "drafter_dtype", None) or args.dtype)
        drafter = load_drafter(args.drafter, dtype=drafter_dtype) if args.drafter else None
        apply_drafter_weights(getattr(args, "drafter_weights", "auto"), target, drafter)
    if drafter is not None:
        target.check_drafter(drafter.config)
    if args.block_size is not None and args.block_size > 1 and drafter is None:
        raise DFlashError("--block-size > 1 needs --drafter")
    return target, drafter


def sampling_params(args, target) -> SamplingParams:
    stop_ids = args.stop_ids if args.stop_ids is not None else default_stop_ids(target)
    return SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, seed=args.seed, stop_token_ids=tuple(stop_ids),
                          min_tokens=args.min_tokens, bad_words_ids=bad_words_ids(args.bad_words, target.tokenizer),
                          repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
                          frequency_penalty=args.frequency_penalty)
