"""tau of the chain and of trees of several budgets, per prompt family, with every output checked against plain
greedy decoding:

    python -m dflash_trt.benchmarks.tree_sweep --engine engines/smollm2-135m --families sharegpt-chat,humaneval

Greedy tau depends on the drafter and the prompts only, not on the machine or its load, so this is the figure
that says how much a tree recovers; whether that pays on a machine is what `dflash-trt bench --tree-budget B`
(and the adaptive policy, `--block-policy adaptive`) measure. Prints one JSON line per family.
"""

from __future__ import annotations

import argparse
import json


def sweep_family(target, drafter, prompts: list[list[int]], params, budgets: list[int]) -> dict:
    """{"tau": {budget: tau}, "identical": {budget: bool}} over `prompts` (budget 0: the chain)."""
    from dflash_trt.decoding.api import generate
    from dflash_trt.decoding.step.verify import tree_or_chain

    plain = [r.token_ids for r in generate(target, None, prompts, params, block_size=1)]
    row: dict = {"tau": {}, "identical": {}}
    for budget in budgets:
        results = generate(target, drafter, prompts, params, method=tree_or_chain(budget))
        lengths = [a for r in results for a in r.acceptance_lengths]
        row["tau"][budget] = round(sum(lengths) / len(lengths), 3) if lengths else 0.0
        row["identical"][budget] = [r.token_ids for r in results] == plain
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="engines/smollm2-135m")
    parser.add_argument("--prompts-dir", default="data/prompts")
    parser.add_argument("--families", default="sharegpt-chat,sharegpt-code,champ-math,humaneval,instructions")
    parser.add_argument("--budgets", default="0,16,32,64", help="tree budgets; 0 is the chain")
    parser.add_argument("--num-prompts", type=int, default=4, help="per family")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args(argv)

    from dflash_trt.benchmarks.in_process import load_prompts
    from dflash_trt.decoding.model.tokens import default_stop_ids, encode_prompt
    from dflash_trt.decoding.step.sampling import SamplingParams
    from dflash_trt.engine import load_engine

    engine = load_engine(args.engine)
    target, drafter = engine.target, engine.drafter
    params = SamplingParams(max_new_tokens=args.max_new_tokens, stop_token_ids=tuple(default_stop_ids(target)))
    budgets = [int(b) for b in args.budgets.split(",")]
    for family in args.families.split(","):
        records = load_prompts(f"{args.prompts_dir}/{family}/heldout.jsonl")[:args.num_prompts]
        prompts = [encode_prompt(target, r.prompt, True) for r in records]
        print(json.dumps({"family": family, **sweep_family(target, drafter, prompts, params, budgets)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
