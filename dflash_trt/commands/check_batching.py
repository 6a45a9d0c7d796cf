"""`dflash-trt check-batching`: served in-flight batching against each request generated alone."""

from __future__ import annotations

from pathlib import Path

from dflash_trt.benchmarks.batching_check import REFERENCES, CheckConfig
from dflash_trt.commands._options import name_list


def register(subparsers) -> None:
    d = CheckConfig()
    parser = subparsers.add_parser(
        "check-batching", help="check that batched serving gives every request the tokens it gets alone",
        description="Send N greedy requests (held-out prompts, mixed max_tokens) to the Triton ensemble at a "
                    "concurrency over gRPC streaming, then generate each alone in process with the same engine "
                    "and compare; exits 1 when any output differs or fails.")
    parser.add_argument("--engine", type=Path, default=d.engine, help="engine directory (default: %(default)s)")
    parser.add_argument("--url", help="gRPC address of a running server of the same engine (e.g. 127.0.0.1:8001); "
                                      "default: serve the engine here for the check")
    parser.add_argument("--requests", type=int, default=d.num_requests, help="(default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=d.concurrency,
                        help="requests in flight; the served batch holds this many (default: %(default)s)")
    parser.add_argument("--min-tokens", type=int, default=d.min_tokens,
                        help="max_tokens of each request is drawn from [min, max] (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens, help="(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=d.seed, help="draws prompts and max_tokens (default: %(default)s)")
    parser.add_argument("--prompts-dir", type=Path, default=d.prompts_dir,
                        help="held-out prompt sets, <dir>/<family>/heldout.jsonl (default: %(default)s)")
    parser.add_argument("--families", type=name_list, default=d.families, help="comma-separated (default: all)")
    parser.add_argument("--no-chat", dest="chat", action="store_false",
                        help="prompts verbatim (a --url server rendered with --chat-template none)")
    parser.add_argument("--reference", choices=REFERENCES, default=d.reference,
                        help="how each request is generated alone: DFlash at the engine's block size, or plain "
                             "decoding (default: %(default)s)")
    parser.add_argument("--instances", type=int, default=d.instances, help="dflash instances (default: %(default)s)")
    parser.add_argument("--num-threads", type=int, default=d.num_threads,
                        help="torch threads per served instance and in process (default 0: the cores)")
    parser.add_argument("--block-policy", choices=("adaptive", "fixed"), default=d.block_policy,
                        help="of the served repository (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=d.out, help="where the server log goes (default: %(default)s)")
    parser.set_defaults(func=run)


def run(args) -> int:
    from transformers.utils import logging as hf_logging

    from dflash_trt.benchmarks.batching_check import run_check
    from dflash_trt.engine.build import ensure_engine

    hf_logging.disable_progress_bar()  # weight-loading bars are noise between the progress lines
    log = lambda line: print(line, flush=True)  # noqa: E731
    config = CheckConfig(engine=ensure_engine(args.engine, log=log), url=args.url, num_requests=args.requests,
                         concurrency=args.concurrency,
                         min_tokens=args.min_tokens, max_tokens=args.max_tokens, seed=args.seed,
                         prompts_dir=args.prompts_dir, families=tuple(args.families), chat=args.chat,
                         reference=args.reference, instances=args.instances, num_threads=args.num_threads,
                         block_policy=args.block_policy, out=args.out)
    report = run_check(config, log)
    print(format_report(report))
    return 0 if not report.differences else 1


def format_report(report, show: int = 5) -> str:
    """The counts, then the first `show` differences with the position of their first different token."""
    s = report.summary()
    lines = [f"requests {s['requests']}, tokens served {s['served_tokens']}, reference {s['reference_tokens']}; "
             f"identical {s['identical']}, different {s['different']} (errors {s['errors']})"]
    for d in report.differences[:show]:
        r = d.request
        head = f"request {r.index} ({r.family}, max_tokens {r.max_tokens}):"
        if d.served.error:
            lines.append(f"{head} error: {d.served.error}")
            continue
        token = (f", reference token {d.expected.token_ids[d.position]}"
                 if d.position < len(d.expected.token_ids) else "")
        lines.append(f"{head} first different token at position {d.position}{token}; served "
                     f"{d.served.num_output_tokens} tokens ({d.served.finish_reason or '-'}), reference "
                     f"{len(d.expected.token_ids)} ({d.expected.finish_reason})")
        lines.append(f"  served:    {d.served.text[:160]!r}")
        lines.append(f"  reference: {d.expected.text[:160]!r}")
    if len(report.differences) > show:
        lines.append(f"... and {len(report.differences) - show} more")
    return "\n".join(lines)
