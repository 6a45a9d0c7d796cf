"""Held-out acceptance length (tau) of a drafter, measured with the project's decoding loop."""

from __future__ import annotations

from dflash_trt.data.prompts import load_prompts


def heldout_prompt_ids(tokenizer, root: str, per_family: int) -> list[tuple[str, list[int]]]:
    """(family, chat-templated prompt ids) of the first `per_family` held-out prompts of each family."""
    from dflash_trt.training.answers import chat_ids

    out, count = [], {}
    for family, prompt in load_prompts(root, "heldout"):
        if count.get(family, 0) < per_family:
            count[family] = count.get(family, 0) + 1
            out.append((family, chat_ids(tokenizer, prompt)))
    return out


def heldout_tau(target, drafter, prompts: list[tuple[str, list[int]]], max_new_tokens: int,
                stop_ids: tuple[int, ...]) -> dict[str, float]:
    """Greedy generation of every prompt with the drafter; returns tau overall and per family."""
    from dflash_trt.decoding.api import generate
    from dflash_trt.decoding.step.sampling import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=tuple(stop_ids))
    was_training = drafter.training
    drafter.eval()
    taus: dict[str, list[float]] = {}
    for family, ids in prompts:  # one at a time: batch 1 is the demo's setting
        result = generate(target, drafter, [ids], params)[0]
        taus.setdefault(family, []).append(result.tau)
    drafter.train(was_training)
    summary = {f"tau_{f}": sum(v) / len(v) for f, v in taus.items()}
    all_taus = [t for v in taus.values() for t in v]
    summary["tau"] = sum(all_taus) / max(1, len(all_taus))
    return summary
