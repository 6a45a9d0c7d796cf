"""`dflash-trt generate`: one generation, printing the text and tau (or one JSON object)."""

from __future__ import annotations

import json

from dflash_trt.commands._options import (add_model_options, add_sampling_options, int_list, load_pair, sampling_params,
                                          verify_method)
from dflash_trt.decoding.model.tokens import decode_tokens, encode_prompt


def register(subparsers) -> None:
    parser = subparsers.add_parser("generate", help="generate text with DFlash speculative decoding",
                                   description="Generate with DFlash; block size 1 is plain decoding.")
    add_model_options(parser)
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text (tokenized with the target's tokenizer)")
    prompt.add_argument("--prompt-ids", type=int_list, help="prompt token ids, e.g. 1,2,3")
    add_sampling_options(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(func=run)


def run(args) -> int:
    from dflash_trt.decoding.api import generate

    target, drafter = load_pair(args)
    prompt_ids = args.prompt_ids if args.prompt_ids is not None else encode_prompt(target, args.prompt, args.chat)
    params = sampling_params(args, target)
    result = generate(target, drafter, [prompt_ids], params, block_size=args.block_size,
                      method=verify_method(args))[0]
    text = decode_tokens(target, result.token_ids)
    if args.json:
        print(json.dumps({**result.to_dict(), "text": text}))
    else:
        print(text if text is not None else " ".join(map(str, result.token_ids)))
        print(f"\n[tau {result.tau:.2f} over {result.num_verify_steps} verify steps, "
              f"{result.num_output_tokens} tokens, {result.finish_reason}; block size {result.block_size}; "
              f"decode {result.decode_s:.2f}s]")
    return 0
