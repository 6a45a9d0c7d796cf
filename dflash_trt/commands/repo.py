"""`dflash-trt repo`: render the Triton model repository for an engine directory."""

from __future__ import annotations

from pathlib import Path

from dflash_trt.serving.preprocess import AUTO_TEMPLATE
from dflash_trt.serving.repo import RepoConfig


def register(subparsers) -> None:
    defaults = RepoConfig(engine_dir=Path("."), out=Path("."))
    parser = subparsers.add_parser("repo", help="render a Triton model repository for an engine",
                                   description="Render preprocessing, dflash, postprocessing, tensorrt_llm and the ensembles "
                                               "from model_repository/templates for an engine directory.")
    parser.add_argument("--engine", type=Path, required=True, help="engine directory (has manifest.json)")
    parser.add_argument("--out", type=Path, help="repository directory (default: model_repository/<engine name>)")
    parser.add_argument("--engine-path", help="the engine directory as the server will see it (default: --engine)")
    parser.add_argument("--chat-template", default=AUTO_TEMPLATE,
                        help="'auto' (default: the tokenizer's chat template when the target ships one, else "
                             "text_input verbatim), 'none' (verbatim: the prompt is already formatted, or the OpenAI "
                             "gateway templates multi-turn chats itself), 'model' (the tokenizer's, required) or a "
                             "Jinja file")
    parser.add_argument("--max-tokens-limit", type=int, help="largest max_tokens accepted (default: min(4096, context))")
    parser.add_argument("--max-context-tokens", type=int, help="prompt + max_tokens limit (default: the engine's)")
    parser.add_argument("--max-prompt-bytes", type=int, default=defaults.max_prompt_bytes,
                        help="largest text_input in UTF-8 bytes, refused before it is tokenized (default 0: "
                             "32 x the context)")
    parser.add_argument("--instances", type=int, default=defaults.dflash_instances,
                        help="dflash model instances; each batches up to --max-batch-sequences requests in flight "
                             f"(default: {defaults.dflash_instances})")
    parser.add_argument("--preprocessing-instances", type=int, default=defaults.preprocessing_instances)
    parser.add_argument("--postprocessing-instances", type=int, default=defaults.postprocessing_instances)
    parser.add_argument("--max-queue-size", type=int, default=defaults.max_queue_size,
                        help=f"requests that may wait for an instance; more are rejected (default: {defaults.max_queue_size})")
    parser.add_argument("--queue-timeout-us", type=int, default=defaults.queue_timeout_us,
                        help="reject requests that waited longer (microseconds; default 0: wait as long as needed)")
    parser.add_argument("--device", default=defaults.device, help="device of local runtimes: cpu (default) or cuda")
    parser.add_argument("--num-threads", type=int, default=defaults.num_threads,
                        help="torch CPU threads per dflash instance (default 0: the usable cores divided among "
                             "the instances, so instances x threads never exceeds the cores)")
    parser.add_argument("--block-size", type=int, default=defaults.block_size,
                        help="largest draft block a step verifies (default 0: the engine's; 1: plain decoding)")
    parser.add_argument("--block-policy", choices=("adaptive", "fixed"), default=defaults.block_policy,
                        help="adaptive (default): each step's block size from measured step costs and acceptance; "
                             "fixed: every step verifies --block-size")
    parser.add_argument("--tree-budget", type=int, default=defaults.tree_budget, metavar="B",
                        help="verify a tree of the drafter's B most probable continuations per sequence "
                             "(torch runtime; default 0: the chain)")
    parser.add_argument("--max-batch-sequences", type=int, default=defaults.max_batch_sequences,
                        help=f"requests one instance decodes together (default: {defaults.max_batch_sequences})")
    parser.add_argument("--max-kv-tokens", type=int, default=defaults.max_kv_tokens,
                        help="KV-cache bound of one instance: rows x longest (prompt + max_tokens + block) "
                             "(default 0: 32768, or one full context when that is larger)")
    parser.add_argument("--prefill-chunk-tokens", type=int, default=defaults.prefill_chunk_tokens,
                        help="prompt tokens prefilled per decoding step (default: "
                             f"{defaults.prefill_chunk_tokens})")
    parser.add_argument("--prefix-cache-bytes", type=int, default=defaults.prefix_cache_bytes, metavar="N",
                        help="bytes of target KV in the prompt-prefix blocks each dflash instance keeps for reuse, "
                             f"their drafter features on top (default {defaults.prefix_cache_bytes}; 0: off)")
    parser.add_argument("--canary-tokens", type=int, default=defaults.canary_tokens,
                        help=f"tokens of the load-time canary generation whose acceptance is logged and exported "
                             f"(default {defaults.canary_tokens}; 0: off)")
    parser.add_argument("--tensorrt-llm-decoupled", action="store_true",
                        help="render the tensorrt_llm model (NVIDIA's LLM-API contract) decoupled, as NVIDIA's "
                             "model.yaml triton_config.decoupled: true: it streams (streaming = true) and is served "
                             "on gRPC streams and generate_stream only (default: not decoupled, NVIDIA's default: "
                             "one answer per request, also for gRPC ModelInfer and HTTP /infer)")
    parser.set_defaults(func=run)


def run(args) -> int:
    from dflash_trt.serving.repo import render_repository

    out = args.out or Path(__file__).resolve().parents[2] / "model_repository" / args.engine.resolve().name
    config = RepoConfig(
        engine_dir=args.engine, out=out, engine_path=args.engine_path, chat_template=args.chat_template,
        max_tokens_limit=args.max_tokens_limit, max_context_tokens=args.max_context_tokens,
        max_prompt_bytes=args.max_prompt_bytes,
        dflash_instances=args.instances, preprocessing_instances=args.preprocessing_instances,
        postprocessing_instances=args.postprocessing_instances, max_queue_size=args.max_queue_size,
        queue_timeout_us=args.queue_timeout_us, device=args.device, num_threads=args.num_threads,
        block_size=args.block_size, block_policy=args.block_policy, max_batch_sequences=args.max_batch_sequences,
        max_kv_tokens=args.max_kv_tokens, prefill_chunk_tokens=args.prefill_chunk_tokens,
        canary_tokens=args.canary_tokens, tensorrt_llm_decoupled=args.tensorrt_llm_decoupled,
        tree_budget=args.tree_budget, prefix_cache_bytes=args.prefix_cache_bytes,
    )
    print(f"model repository: {render_repository(config)}")
    return 0
