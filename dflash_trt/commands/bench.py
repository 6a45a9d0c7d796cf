"""`dflash-trt bench`: tau, decode-phase speedup vs block_size 1, and output identity on a prompt file."""

from __future__ import annotations

import json
import sys

from dflash_trt.commands._options import (add_logits_options, add_model_options, int_list, load_pair, sampling_params,
                                          verify_method)
from dflash_trt.decoding.model.tokens import encode_prompt


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="measure tau and speedup against plain decoding",
                                   description="Run every prompt with DFlash and with block size 1, "
                                               "interleaved, and compare.")
    add_model_options(parser)
    parser.add_argument("--prompts", required=True, help="prompt file: one per line, or JSON lines with 'prompt'")
    parser.add_argument("--max-new-tokens", type=int, required=True)
    parser.add_argument("--limit", type=int, help="use only the first N prompts")
    parser.add_argument("--stop-ids", type=int_list, help="stop token ids (default: the target's EOS)")
    add_logits_options(parser)  # decoding stays greedy, so DFlash and block size 1 must still agree
    parser.add_argument("--block-policy", choices=("fixed", "adaptive"), default="fixed",
                        help="fixed (default): every DFlash step verifies --block-size (a tree of --tree-budget "
                             "nodes if given); adaptive: the serving policy chooses each step (plain, a chain, or "
                             "a tree of up to --tree-budget nodes) from measured step costs and acceptance")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run, temperature=0.0, top_k=0, top_p=1.0, seed=None)


def run(args) -> int:
    from dflash_trt.benchmarks.in_process import load_prompts, run_benchmark
    from dflash_trt.errors import DFlashError

    records = load_prompts(args.prompts)[: args.limit]
    target, drafter = load_pair(args)
    if drafter is None:
        raise DFlashError("bench needs --drafter (it compares DFlash with plain decoding)")
    prompts = [encode_prompt(target, r.prompt, args.chat) for r in records]

    def progress(done, total, report):
        print(f"\r[{done}/{total}] tau {report.tau:.2f}", end="", file=sys.stderr, flush=True)

    report = run_benchmark(target, drafter, prompts, sampling_params(args, target), args.block_size, progress,
                           verify_method(args), args.block_policy)
    print(file=sys.stderr)
    summary = report.to_dict()
    summary["memory_traffic"] = _memory_traffic(target, summary)
    if args.json:
        print(json.dumps(summary))
    else:
        tree = f", tree of {summary['tree_budget']} nodes" if summary["tree_budget"] else ""
        print(f"prompts {summary['num_prompts']}, block size {summary['block_size']}{tree}, "
              f"{summary['block_policy']} policy")
        if summary["plans"]:
            print("steps per plan: " + "  ".join(f"{name}: {n}" for name, n in summary["plans"].items()))
        print(f"tau {summary['tau']:.2f}   speedup {summary['speedup']:.2f}x   "
              f"TPOT {summary['tpot_ms']['dflash']:.1f} ms vs {summary['tpot_ms']['baseline']:.1f} ms   "
              f"identical outputs: {'yes' if summary['identical'] else 'NO'}")
        traffic = summary["memory_traffic"]
        print(f"target weights per step {traffic['weight_mb_per_step']:.1f} MB: per token "
              f"{traffic['mb_per_token']['dflash']:.1f} MB (DFlash) vs {traffic['mb_per_token']['baseline']:.1f} MB, "
              f"implying {traffic['gb_per_s']['dflash']:.1f} vs {traffic['gb_per_s']['baseline']:.1f} GB/s")
        print("acceptance length histogram: " +
              " ".join(f"{k}:{v}" for k, v in summary["acceptance_histogram"].items()))
    return 0


def _memory_traffic(target, summary: dict) -> dict:
    """Target weight bytes each step reads, per output token, and the bandwidth the measured TPOT implies.

    One target forward per step; DFlash emits tau tokens per step, plain decoding one.
    """
    from dflash_trt.decoding.model.gguf_weights import weight_bytes_per_step

    megabytes = weight_bytes_per_step(target.model) / 1e6
    per_token = {"dflash": megabytes / max(summary["tau"], 1e-9), "baseline": megabytes}
    return {"weight_mb_per_step": megabytes, "mb_per_token": per_token,
            "gb_per_s": {mode: per_token[mode] / summary["tpot_ms"][mode] for mode in per_token}}
