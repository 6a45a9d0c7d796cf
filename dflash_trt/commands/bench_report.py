"""`dflash-trt bench-report` (`make bench`): block-size sweep in process, serving load test, summary and plots."""

from __future__ import annotations

from pathlib import Path

from dflash_trt.benchmarks.config import BenchConfig
from dflash_trt.commands._options import int_list, name_list


def register(subparsers) -> None:
    d = BenchConfig()
    parser = subparsers.add_parser(
        "bench-report", help="benchmark an engine in process and through Triton; write summary.json and plots",
        description="Per prompt family: tau, acceptance-length histogram and decode-phase speedup vs block size 1 "
                    "for a sweep of block sizes (interleaved, one run); then the Triton ensemble under load at "
                    "each concurrency, DFlash against plain decoding served the same way.")
    parser.add_argument("--engine", type=Path, default=d.engine, help="engine directory (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=d.out, help="output directory (default: %(default)s)")
    parser.add_argument("--prompts-dir", type=Path, default=d.prompts_dir,
                        help="held-out prompt sets, <dir>/<family>/heldout.jsonl (default: %(default)s)")
    parser.add_argument("--families", type=name_list, default=d.families, help="comma-separated (default: all)")
    parser.add_argument("--num-prompts", type=int, default=d.num_prompts, help="per family (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="(default: %(default)s)")
    parser.add_argument("--block-sizes", type=int_list, default=d.block_sizes,
                        help="e.g. 2,4,8 (default: 2, 4, 8, ... up to the engine's block size)")
    parser.add_argument("--no-chat", dest="chat", action="store_false",
                        help="feed prompts verbatim instead of through the tokenizer's chat template")
    parser.add_argument("--num-threads", type=int, default=d.num_threads,
                        help="torch CPU threads in process and per served instance (default 0: in process "
                             "torch's choice, served: the cores divided among the instances)")
    parser.add_argument("--no-serving", dest="serving", action="store_false", help="skip the Triton load test")
    parser.add_argument("--concurrency", type=int_list, default=d.concurrency,
                        help="concurrency levels (default: 1,4,16,32)")
    parser.add_argument("--duration", type=float, default=d.duration_s,
                        help="seconds per concurrency level (default: %(default)s)")
    parser.add_argument("--length-spread", type=float, default=d.served_length_spread, metavar="SHARE",
                        help="served requests ask for --max-new-tokens +- this share of it, a seeded sequence "
                             "that every server is sent alike; 0: all the same length (default: %(default)s)")
    parser.add_argument("--serving-rounds", type=int, default=d.serving_rounds, metavar="R",
                        help="served runs of --duration per mode and level, the order of the modes changing from "
                             "round to round; a level's figures are its runs together (default: %(default)s)")
    parser.add_argument("--instances", type=int, default=d.instances,
                        help="dflash model instances per served repository, each batching in flight "
                             "(default: %(default)s)")
    parser.add_argument("--min-user-tokens-per-s", type=float, default=d.min_user_tokens_per_s,
                        help="interactivity floor X: report the best total tok/s at which every request still "
                             "gets >= X tok/s (default: %(default)s)")
    parser.add_argument("--sequential-baseline", action="store_true",
                        help="also serve DFlash one request at a time (max_batch_sequences 1)")
    parser.add_argument("--plain-control", action="store_true",
                        help="also serve plain decoding a second time, loaded in turn with the others, and report "
                             "what the two plain servers differ by: the resolution of the DFlash / plain ratio on "
                             "this machine")
    parser.add_argument("--tree-budget", type=int, default=d.tree_budget, metavar="B",
                        help="served DFlash: the repository's tree_budget, the largest tree the adaptive policy may "
                             "verify per step (default: 0, chains only)")
    parser.add_argument("--no-multi-turn", dest="multi_turn", action="store_false",
                        help="skip the multi-turn scenario (conversations replayed turn by turn, with and without "
                             "the prefix cache)")
    parser.add_argument("--multi-turn-conversations", type=int, default=d.multi_turn_conversations,
                        help="conversations of the multi-turn scenario (default: %(default)s)")
    parser.add_argument("--multi-turn-concurrency", type=int_list, default=d.multi_turn_concurrency,
                        help="conversations in flight at once, one level per run (default: 1,8)")
    parser.add_argument("--prefix-cache-bytes", type=int, default=d.prefix_cache_bytes, metavar="N",
                        help="byte budget of the prefix cache in the multi-turn scenario (default: %(default)s)")
    parser.add_argument("--report", type=Path, metavar="FILE.md",
                        help="also write the results as a Markdown page with date, commit, machine and this command "
                             "(`make results` writes docs/results.md this way)")
    parser.add_argument("--readme", type=Path, metavar="README.md",
                        help="also rewrite the headline results table between the results markers of this file "
                             "(`make results` updates README.md this way)")
    parser.set_defaults(func=run)


def run(args) -> int:
    from dflash_trt.benchmarks.markdown import (current_commit, headline_table, invoked_command, update_readme,
                                                write_results_page)
    from dflash_trt.benchmarks.report import format_table
    from dflash_trt.benchmarks.run import run_bench
    from dflash_trt.engine.build import ensure_engine

    commit = current_commit()  # the code measured, whatever changes while it runs
    config = BenchConfig(
        engine=ensure_engine(args.engine, log=lambda line: print(line, flush=True)), out=args.out,
        prompts_dir=args.prompts_dir, families=tuple(args.families),
        num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, block_sizes=tuple(args.block_sizes),
        chat=args.chat, num_threads=args.num_threads, serving=args.serving, concurrency=tuple(args.concurrency),
        duration_s=args.duration, served_length_spread=args.length_spread, serving_rounds=args.serving_rounds,
        instances=args.instances,
        min_user_tokens_per_s=args.min_user_tokens_per_s,
        sequential_baseline=args.sequential_baseline, plain_control=args.plain_control, tree_budget=args.tree_budget,
        multi_turn=args.multi_turn,
        multi_turn_conversations=args.multi_turn_conversations,
        multi_turn_concurrency=tuple(args.multi_turn_concurrency), prefix_cache_bytes=args.prefix_cache_bytes)
    summary = run_bench(config, log=lambda line: print(line, flush=True))
    print()
    print(format_table(summary))
    command = invoked_command(args.argv)
    if args.report:
        print(f"report: {write_results_page(summary, args.report, commit, command)}")
    if args.readme:
        print(f"results table: {update_readme(args.readme, headline_table(summary, command, commit))}")
    return 0
