"""Teacher-forced acceptance of a drafter at every position of the target's own greedy answers.

Training draws its anchors at random among response positions; the greedy decoding loop visits only
some of them: after a rejection, the next block starts at the target's correction, so the loop's
anchors fall where the drafter has just been wrong. Scoring every anchor of a greedy answer in one
masked drafter forward (the training recipe's, `recipe.drafter_block_states`) gives both sides:

- `accepted[i]`: the drafts the target would accept in a block anchored at response position i;
- the loop's path over them (anchor a -> a + produced), whose acceptance lengths are the loop's own
  (`tests/training/test_acceptance_profile.py` checks them against `decoding.generate`).

The mean over every anchor is what the training loss sees; the mean over the path is the served tau.
How far apart they are says how much tau is lost to where the loop lands rather than to what the
drafter knows. It also costs one forward per answer instead of a decoding loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash_trt.decoding.model.protocols import Proposal


@dataclass
class AcceptanceProfile:
    """accepted[i]: drafts accepted in a block anchored at response position i; path_lengths: the greedy
    loop's acceptance lengths (tokens produced per verify step, the prefill token excluded)."""

    accepted: list[int]
    path_lengths: list[int]

    @property
    def tau_all_anchors(self) -> float:
        """Mean tokens a verify step would produce at a random response position (accepted drafts + 1)."""
        return sum(a + 1 for a in self.accepted) / max(1, len(self.accepted))

    @property
    def tau(self) -> float:
        """The greedy loop's tau: mean tokens produced per verify step."""
        return sum(self.path_lengths) / max(1, len(self.path_lengths))


def accepted_at_every_anchor(target, drafter, ids: list[int], prompt_len: int,
                             features: torch.Tensor) -> list[int]:
    """Drafts the target accepts (leading slots equal to its greedy tokens) at each anchor prompt_len..len-2.

    ids: prompt + the target's greedy answer; features [len(ids), K*D]: the target's layer features.
    """
    from dflash_trt.training.recipe import build_batch, drafter_block_states

    if drafter.config.input_embedding_scale != 1.0:  # the recipe's forward embeds without it
        raise ValueError("acceptance profiles take drafters without input_embedding_scale")
    q = drafter.config.block_size
    anchors = torch.arange(prompt_len, len(ids) - 1)
    if len(anchors) == 0:
        return []
    sample = {"ids": torch.tensor(ids), "prompt_len": prompt_len, "features": features}
    batch = build_batch([sample], [anchors], q, drafter.config.mask_token_id, gamma=1.0)
    embed_weight = target.model.get_input_embeddings().weight
    with torch.inference_mode():
        states = drafter_block_states(drafter, embed_weight, batch).view(len(anchors), q, -1)
        drafts = drafter.choose_drafts(target, states[:, 1:], torch.tensor(ids)[anchors], None, None)
    if isinstance(drafts, Proposal):
        drafts = drafts.drafts
    labels = batch["labels"].view(len(anchors), q)[:, 1:]
    in_answer = (anchors[:, None] + torch.arange(1, q)) < len(ids)
    correct = (drafts == labels) & in_answer
    return correct.int().cumprod(dim=1).sum(dim=1).tolist()


def greedy_path(accepted: list[int], answer_len: int, block_size: int) -> list[int]:
    """Acceptance lengths of the greedy loop over an answer of `answer_len` tokens (the first from prefill).

    As in `decoding`: a block holds min(block_size, tokens left + 1) slots, a step produces its accepted
    drafts plus the target's own token, cut at the answer's end (max_new_tokens or the stop token).
    """
    lengths, produced = [], 1
    while produced < answer_len:
        left = answer_len - produced
        step = min(accepted[produced - 1], block_size - 1, left) + 1
        lengths.append(min(step, left))
        produced += lengths[-1]
    return lengths


def acceptance_profile(target, drafter, ids: list[int], prompt_len: int,
                       features: torch.Tensor) -> AcceptanceProfile:
    accepted = accepted_at_every_anchor(target, drafter, ids, prompt_len, features)
    return AcceptanceProfile(accepted, greedy_path(accepted, len(ids) - prompt_len, drafter.config.block_size))


def family_answers(target, split: str, prompts_root: str, families: tuple[str, ...] | None, per_family: int,
                   max_new_tokens: int, stop_ids: tuple[int, ...]) -> list[tuple[str, list[int], int]]:
    """(family, prompt + greedy answer ids, prompt length) for the first `per_family` prompts of each family."""
    from dflash_trt.data.prompts import load_prompts
    from dflash_trt.decoding.api import generate
    from dflash_trt.decoding.step.sampling import SamplingParams
    from dflash_trt.training.answers import chat_ids

    chosen: dict[str, list[list[int]]] = {}
    for family, prompt in load_prompts(prompts_root, split, families):
        if len(chosen.setdefault(family, [])) < per_family:
            chosen[family].append(chat_ids(target.tokenizer, prompt))
    params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=stop_ids)
    out = []
    for family, prompt_ids in chosen.items():
        for ids, result in zip(prompt_ids, generate(target, None, prompt_ids, params)):
            out.append((family, ids + result.token_ids, len(ids)))
    return out


def main(argv: list[str] | None = None) -> int:
    """Per family and drafter: the greedy loop's tau and the mean over every anchor, from one forward each."""
    import argparse

    from dflash_trt.decoding.model.drafters import load_drafter
    from dflash_trt.decoding.model.target import load_target
    from dflash_trt.decoding.model.tokens import default_stop_ids
    from dflash_trt.training.features import target_features
    from dflash_trt.training.target_io import resolve_target_path

    parser = argparse.ArgumentParser(prog="python -m dflash_trt.training.acceptance_profile", description=main.__doc__)
    parser.add_argument("--drafter", action="append", required=True, help="drafter directory (repeatable)")
    parser.add_argument("--target", default="smollm2", help="model directory, .gguf, or smollm2 (the demo target)")
    parser.add_argument("--prompts", default="data/prompts")
    parser.add_argument("--split", default="heldout", choices=("heldout", "train"))
    parser.add_argument("--families", default="", help="comma-separated (default: all)")
    parser.add_argument("--num-prompts", type=int, default=8, help="per family")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    target = load_target(resolve_target_path(args.target))
    stop_ids = tuple(default_stop_ids(target))  # the stop ids `dflash-trt bench` uses
    families = tuple(f for f in args.families.split(",") if f) or None
    answers = family_answers(target, args.split, args.prompts, families, args.num_prompts, args.max_new_tokens, stop_ids)
    drafters = [load_drafter(path).eval() for path in args.drafter]
    layer_ids = {tuple(d.config.target_layer_ids) for d in drafters}
    features = {ids: [target_features(target.model, [x], ids)[0] for _, x, _ in answers] for ids in layer_ids}
    print(f"{args.split} prompts, {args.num_prompts} per family, {args.max_new_tokens} new tokens, greedy; "
          "tau = the greedy loop's, all = mean over every anchor (accepted drafts + 1); "
          "both averaged over answers, as `dflash-trt bench` averages tau")
    header = "| family | " + " | ".join(f"{path}: tau / all" for path in args.drafter) + " |"
    print(header + "\n|" + "---|" * (1 + len(drafters)))
    rows: dict[str, list[list[AcceptanceProfile]]] = {}
    for i, (family, ids, prompt_len) in enumerate(answers):
        rows.setdefault(family, [[] for _ in drafters])
        for j, drafter in enumerate(drafters):
            feats = features[tuple(drafter.config.target_layer_ids)][i]
            rows[family][j].append(acceptance_profile(target, drafter, ids, prompt_len, feats))
    for family, per_drafter in [*rows.items(), ("all", [sum((r[j] for r in rows.values()), [])
                                                       for j in range(len(drafters))])]:
        cells = []
        for profiles in per_drafter:  # macro averages over the answers, as `dflash-trt bench` reports tau
            profiles = [p for p in profiles if p.path_lengths]
            tau = sum(p.tau for p in profiles) / max(1, len(profiles))
            all_anchors = sum(p.tau_all_anchors for p in profiles) / max(1, len(profiles))
            cells.append(f"{tau:.2f} / {all_anchors:.2f}")
        print(f"| {family} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
