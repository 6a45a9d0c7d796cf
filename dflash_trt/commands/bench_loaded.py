"""`dflash-trt bench-loaded` (`make bench-loaded`): DFlash against plain decoding under load, in process, one step
each in turn (benchmarks/interleaved.py)."""

from __future__ import annotations

import json
from pathlib import Path

from dflash_trt.benchmarks.config import PROMPTS_DIR, REPO_ROOT, spread_tokens
from dflash_trt.commands._options import int_list, name_list


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench-loaded", help="DFlash against plain decoding under load, in process, one step each in turn",
        description="At each concurrency, a DFlash scheduler (the adaptive policy, as served) and a plain one keep "
                    "that many greedy requests in flight (each finished request replaced at once, the same request "
                    "sequence for both) and take one step each in turn: a shared machine's drift falls on both "
                    "within milliseconds (two plain schedulers agree within about 1%). Prints one line per level.")
    parser.add_argument("--engine", type=Path, default=REPO_ROOT / "engines" / "smollm2-135m",
                        help="engine directory (default: %(default)s)")
    parser.add_argument("--prompts-dir", type=Path, default=PROMPTS_DIR,
                        help="held-out prompt sets, <dir>/<family>/heldout.jsonl (default: %(default)s)")
    parser.add_argument("--families", type=name_list, default=(), help="comma-separated (default: all)")
    parser.add_argument("--num-prompts", type=int, default=4, help="per family (default: %(default)s)")
    parser.add_argument("--no-chat", dest="chat", action="store_false",
                        help="feed prompts verbatim instead of through the tokenizer's chat template")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="(default: %(default)s)")
    parser.add_argument("--length-spread", type=float, default=0.25, metavar="SHARE",
                        help="requests ask for --max-new-tokens +- this share of it, a seeded sequence that every "
                             "mode gets alike (default: %(default)s)")
    parser.add_argument("--concurrency", type=int_list, default=(4, 16, 32),
                        help="requests in flight, one level after the other (default: 4,16,32)")
    parser.add_argument("--steps", type=int, default=1000, help="counted steps per mode and level (default: "
                                                                "%(default)s)")
    parser.add_argument("--warmup-steps", type=int, default=200,
                        help="steps per mode and level before counting starts (default: %(default)s)")
    parser.add_argument("--windows", type=int, default=10,
                        help="stretches the counted steps are cut into for the ratio's interval (default: "
                             "%(default)s)")
    parser.add_argument("--plain-control", action="store_true",
                        help="also a second plain scheduler: what two identical schedulers differ by")
    parser.add_argument("--tree-budget", type=int, default=0, metavar="B",
                        help="the largest tree the DFlash policy may verify per step (default: 0, chains only)")
    parser.add_argument("--num-threads", type=int, default=1,
                        help="torch CPU threads (default: %(default)s, as one served instance of `make results` "
                             "on 2 cores; 0: torch's choice)")
    parser.add_argument("--out", type=Path, metavar="FILE.json", help="also write the figures as JSON")
    parser.set_defaults(func=run)


def run(args) -> int:
    import torch
    from transformers.utils import logging as hf_logging

    from dflash_trt.benchmarks.interleaved import describe, run_level
    from dflash_trt.benchmarks.prompts import heldout_prompts
    from dflash_trt.decoding.model.tokens import default_stop_ids, encode_prompt
    from dflash_trt.engine import load_engine
    from dflash_trt.engine.build import ensure_engine
    from dflash_trt.errors import DFlashError

    hf_logging.disable_progress_bar()
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    engine = load_engine(ensure_engine(args.engine, log=lambda line: print(line, flush=True)))
    if engine.drafter is None:
        raise DFlashError(f"{args.engine}: its {engine.runtime} runtime has no drafter in process here")
    records = [r for r in heldout_prompts(args.prompts_dir, tuple(args.families), args.num_prompts)
               if isinstance(r.prompt, str)]
    prompts = [encode_prompt(engine.target, r.prompt, args.chat) for r in records]
    spread = spread_tokens(args.length_spread, args.max_new_tokens)
    print(f"{len(prompts)} prompts, requests of {args.max_new_tokens - spread}-{args.max_new_tokens + spread} "
          f"tokens, {args.warmup_steps} warm-up + {args.steps} counted steps per mode and level", flush=True)
    results = []
    for level in args.concurrency:
        result = run_level(engine.target, engine.drafter, prompts, level, block_size=engine.block_size,
                           steps=args.steps, warmup_steps=args.warmup_steps, max_new_tokens=args.max_new_tokens,
                           spread=spread, stop_ids=default_stop_ids(engine.target), windows=args.windows,
                           plain_control=args.plain_control, tree_budget=args.tree_budget)
        print(describe(result), flush=True)
        results.append(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command": " ".join(["dflash-trt", *args.argv]), "levels": results},
                                       indent=2) + "\n")
        print(f"figures: {args.out}")
    return 0 if all(r["identical"] for r in results) else 1
