"""Tree verification (step/verify/tree.py): lossless, never worse than the chain, and it recovers near misses.

Greedy tokens equal plain decoding for every target family (Llama; Qwen3 with sliding-window layers; gpt-oss with
sliding layers and eager attention), for budgets 1..64, in a batch that requests join and leave; the tree built
is the brute-force top-B prefixes; one candidate per slot and a budget of block - 1 is the chain, token for token
and step for step; the drafter's context after a tree step is the committed sequence's (sliding-window drafters
included); a wrong mask, wrong positions or a wrong compaction change the tokens.
"""

from __future__ import annotations

import functools
import itertools
import random

import pytest
import torch
from tree_oracle import NearMissOracle

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.model.drafters import load_drafter
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.scheduler.block_policy import FixedBlockSize, StepPlan
from dflash_trt.decoding.scheduler.scheduler import Scheduler, SchedulerLimits
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.decoding.step.verify import ChainVerify, TreeVerify, tree_or_chain, verify_method
from dflash_trt.decoding.step.verify.tree import build_tree
from dflash_trt.errors import DFlashError
from dflash_trt.testing import make_tiny_drafter, make_tiny_target, tiny_drafter_config

BLOCK = 8
MAX_NEW = [24, 9, 18, 24, 13]  # per request: short ones leave while others run
LENGTHS = [1, 9, 30, 4, 17]
FAMILIES = ["llama", "qwen3-sliding", "gpt_oss"]
ARRIVALS = {0: [0, 1], 2: [2], 3: [3], 6: [4]}  # step -> requests arriving before it


def family_target(family: str) -> TargetModel:
    if family == "qwen3-sliding":  # a window of 4 positions: tree depths cross it
        return TargetModel(make_tiny_target("qwen3", seed=2, use_sliding_window=True, sliding_window=4,
                                            layer_types=["sliding_attention", "full_attention"] * 3))
    return TargetModel(make_tiny_target(family, seed=2))


@functools.cache
def family_data(name: str):
    """(name, target, prompts, greedy references of plain decoding)."""
    target = family_target(name)
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 250, (n,), generator=generator).tolist() for n in LENGTHS]
    references = [generate(target, None, [p], SamplingParams(max_new_tokens=n), block_size=1)[0].token_ids
                  for p, n in zip(prompts, MAX_NEW)]
    return name, target, prompts, references


@pytest.fixture(params=FAMILIES)
def family(request):
    return family_data(request.param)


def near_miss_oracle(target, prompts, references, **drafter_settings) -> NearMissOracle:
    config = tiny_drafter_config(target.config, block_size=BLOCK, **drafter_settings)
    oracle = NearMissOracle(config, [p + r for p, r in zip(prompts, references)])
    oracle.load_state_dict(make_tiny_drafter(target.config, block_size=BLOCK, **drafter_settings).state_dict())
    return oracle


def run(target, drafter, prompts, method, max_batch_size: int = 3, policy=None, **settings):
    """Drive a scheduler through ARRIVALS (requests join while others run and leave); settings go to every
    request's SamplingParams. Returns the results in request order."""
    scheduler = Scheduler(target, drafter, BLOCK, SchedulerLimits(max_batch_size=max_batch_size,
                                                                  prefill_chunk_tokens=16),
                          policy or FixedBlockSize(BLOCK), method)
    results, step = {}, 0
    while step <= max(ARRIVALS) or scheduler.has_unfinished:
        for i in ARRIVALS.get(step, []):
            scheduler.add_request(prompts[i], SamplingParams(max_new_tokens=MAX_NEW[i], **settings), request_id=i)
        for out in scheduler.step():
            if out.is_final:
                results[out.index] = out.result
        step += 1
        assert step < 500, "the scheduler does not finish"
    return [results[i] for i in range(len(prompts))]


def tau(results) -> float:
    lengths = [a for r in results for a in r.acceptance_lengths]
    return sum(lengths) / len(lengths)


def assert_plain_tokens(results, references):
    for i, (result, reference) in enumerate(zip(results, references)):
        assert result.token_ids == reference, f"request {i}"


# -- greedy: plain decoding's tokens, more accepted than the chain --------------------------------------------------
FAST = {("llama", 1), ("llama", 16), ("qwen3-sliding", 64), ("gpt_oss", 16)}  # the rest of the grid is marked slow


@pytest.mark.parametrize("name, budget", [
    pytest.param(name, budget, marks=() if (name, budget) in FAST else pytest.mark.slow)
    for name in FAMILIES for budget in (1, 2, 7, 16, 64)])
def test_tree_gives_plain_tokens_and_beats_the_chain(name, budget):
    name, target, prompts, references = family_data(name)
    chain = run(target, near_miss_oracle(target, prompts, references), prompts, ChainVerify())
    tree = run(target, near_miss_oracle(target, prompts, references), prompts, TreeVerify(budget))
    assert_plain_tokens(chain, references)
    assert_plain_tokens(tree, references)
    if budget >= 2 * BLOCK:  # budget beyond the spine: near misses at ranks 1-3 are recovered
        assert tau(tree) > 1.2 * tau(chain), (tau(tree), tau(chain))
    else:  # mostly the spine (a budget below block - 1 cuts it short): never fewer than the chain's
        assert tau(tree) >= tau(chain) or budget < BLOCK - 1


def test_real_drafters_give_plain_tokens_with_a_tree(family, tmp_path):
    """The drafters' own top-K (DFlash marginals; DFlash2's lattice; a sliding-window DFlash drafter)."""
    name, target, prompts, references = family
    for kind, settings in [("dflash", {}), ("dflash2", {"family": "dflash2"}), ("sliding", {"sliding_window": 4})]:
        drafter = make_tiny_drafter(target.config, directory=tmp_path / kind, block_size=BLOCK, **settings)
        drafter = load_drafter(tmp_path / kind)
        results = run(target, drafter, prompts, TreeVerify(24, 4))
        assert_plain_tokens(results, references)


def test_logits_processors_run_per_node_with_its_own_prefix(family):
    """Penalties, min_tokens and bad words change greedy tokens; each node is processed with its own path."""
    name, target, prompts, _ = family
    settings = dict(repetition_penalty=1.4, frequency_penalty=0.3, min_tokens=6, stop_token_ids=(7,),
                    bad_words_ids=((3, 9), (11,)))
    references = [generate(target, None, [p], SamplingParams(max_new_tokens=n, **settings), block_size=1)[0].token_ids
                  for p, n in zip(prompts, MAX_NEW)]
    assert references != family[3], "the processors should change the greedy tokens"
    results = run(target, near_miss_oracle(target, prompts, references), prompts, TreeVerify(32), **settings)
    assert_plain_tokens(results, references)
    assert max(a for r in results for a in r.acceptance_lengths) > 2


# -- the budget policy: plain, chain or tree per step ----------------------------------------------------------------
class ScriptedPolicy:
    """A BlockSizePolicy that cycles through given plans (a test double: the real policy's choices follow timing)."""

    def __init__(self, plans):
        self.plans, self.max_block_size = plans, BLOCK
        self.tree_budgets = sorted({p.tree_budget for p in plans if p.tree_budget})
        self.steps = itertools.cycle(plans)
        self.observed = []

    def choose(self, batch_size, **_):
        return next(self.steps)

    def observe(self, batch_size, plan, seconds, accepted):
        self.observed.append(plan)

    def observe_catch_up(self, rows, seconds):
        pass

    def observe_overhead(self, batch_size, seconds):
        pass


SWITCHING = [StepPlan(1), StepPlan(BLOCK, 16), StepPlan(BLOCK, 0), StepPlan(3, 32), StepPlan(1), StepPlan(5, 0),
             StepPlan(BLOCK, 32)]


def test_plans_switching_between_plain_chain_and_tree_give_plain_tokens(family, tmp_path):
    """Every step runs what the policy chose (plain, chains of several sizes, trees of several budgets), in a
    ragged batch that requests join and leave: plain decoding's tokens, for DFlash and DFlash2 drafters."""
    name, target, prompts, references = family
    policy = ScriptedPolicy(SWITCHING)
    results = run(target, near_miss_oracle(target, prompts, references), prompts, ChainVerify(), policy=policy)
    assert_plain_tokens(results, references)
    assert {p.tree_budget for p in policy.observed} == {0, 16, 32}
    make_tiny_drafter(target.config, directory=tmp_path / "d2", block_size=BLOCK, family="dflash2")
    results = run(target, load_drafter(tmp_path / "d2"), prompts, ChainVerify(), policy=ScriptedPolicy(SWITCHING))
    assert_plain_tokens(results, references)


def test_a_planned_tree_really_verifies_a_tree():
    """The same chain/tree schedule accepts more when its tree steps run as trees than when they are replaced by
    chains (the near-miss drafter's siblings): the scheduler honours the plan's tree budget."""
    name, target, prompts, references = family_data("llama")
    trees = [StepPlan(BLOCK, 32), StepPlan(BLOCK, 0)]
    chains = [StepPlan(BLOCK, 0), StepPlan(BLOCK, 0)]
    with_trees = run(target, near_miss_oracle(target, prompts, references), prompts, ChainVerify(),
                     policy=ScriptedPolicy(trees))
    without = run(target, near_miss_oracle(target, prompts, references), prompts, ChainVerify(),
                  policy=ScriptedPolicy(chains))
    assert_plain_tokens(with_trees, references)
    assert tau(with_trees) > 1.1 * tau(without), (tau(with_trees), tau(without))


def test_the_default_policy_under_a_tree_cap_tries_each_budget_and_stays_lossless():
    name, target, prompts, references = family_data("llama")
    scheduler_method = TreeVerify(32, 4)
    scheduler = Scheduler(target, near_miss_oracle(target, prompts, references), BLOCK,
                          SchedulerLimits(max_batch_size=3), method=scheduler_method)
    assert scheduler.policy.tree_budgets == [8, 16, 32] and scheduler.verify_slots == 33
    for i, prompt in enumerate(prompts):
        scheduler.add_request(prompt, SamplingParams(max_new_tokens=MAX_NEW[i]), request_id=i)
    results = {}
    while scheduler.has_unfinished:
        for out in scheduler.step():
            if out.is_final:
                results[out.index] = out.result
    assert_plain_tokens([results[i] for i in range(len(prompts))], references)
    assert set(scheduler.policy.tree_tokens) == {8, 16, 32}


# -- the tree is the top-B prefixes -----------------------------------------------------------------------------
def brute_force(children, anchor: int, max_depth: int, budget: int) -> set[tuple[int, ...]]:
    """Every prefix up to max_depth, scored in the same order; the spine, then the best others by (-score, ranks)."""
    prefixes = []  # (key, tokens)

    def grow(tokens, ranks, score, parent_token):
        depth = len(ranks)
        if depth == max_depth:
            return
        ids, logprobs = children(depth, parent_token)
        for rank, (token, logprob) in enumerate(zip(ids, logprobs)):
            child_score = score + logprob
            prefixes.append(((-child_score, ranks + (rank,)), tokens + (token,)))
            grow(tokens + (token,), ranks + (rank,), child_score, token)

    grow((), (), 0.0, anchor)
    spine = [p for p in prefixes if set(p[0][1]) == {0} and len(p[0][1]) <= min(budget, max_depth)]
    others = sorted(p for p in prefixes if p not in spine)
    return {tokens for _, tokens in spine + others[:budget - len(spine)]}


def lattice(vocab: int, k: int, depth: int, seed: int, ties: bool):
    """children(slot, parent_token): each (slot, parent) its own ranking (DFlash2's lattice; a marginal when the
    parent is ignored). ties: log-probs on a coarse grid, so equal scores are common."""
    rng = random.Random(seed)
    table = {}
    for slot, parent in itertools.product(range(depth), range(vocab)):
        ids = rng.sample(range(vocab), k)
        logprobs = sorted((-round(rng.uniform(0, 3)) if ties else -rng.uniform(0, 3) for _ in range(k)), reverse=True)
        table[slot, parent] = (ids, [float(x) for x in logprobs])
    return lambda slot, parent: table[slot, parent]


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("marginal", [True, False])
def test_the_tree_is_the_brute_force_top_b_prefixes(marginal, ties):
    for seed in range(6):
        children = lattice(vocab=5, k=3, depth=4, seed=seed, ties=ties)
        if marginal:
            children = (lambda c: lambda slot, parent: c(slot, 0))(children)
        for budget, max_depth in itertools.product(range(1, 25), (1, 2, 4)):
            tree = build_tree(children, 3, max_depth, budget)
            paths = {tuple(tree.tokens[n] for n in tree.path(node)) for node in range(len(tree))}
            assert paths == brute_force(children, 3, max_depth, budget), (seed, budget, max_depth)
            assert len(tree) == len(paths)  # no prefix twice: siblings are distinct
            assert all(parent < node for node, parent in enumerate(tree.parents))  # parents first
            spine = [tree.tokens[n] for n in range(min(budget, max_depth))]
            token = 3
            for depth in range(min(budget, max_depth)):  # the spine comes first, in order
                token = children(depth, token)[0][0]
                assert spine[depth] == token and tree.depths[depth] == depth + 1


# -- one candidate, block - 1 nodes: the chain ------------------------------------------------------------------
def test_one_candidate_and_budget_block_minus_one_is_the_chain(family, tmp_path):
    name, target, prompts, references = family
    chain = run(target, near_miss_oracle(target, prompts, references), prompts, ChainVerify())
    tree = run(target, near_miss_oracle(target, prompts, references), prompts, TreeVerify(BLOCK - 1, 1))
    assert [r.token_ids for r in tree] == [r.token_ids for r in chain]
    assert [r.acceptance_lengths for r in tree] == [r.acceptance_lengths for r in chain]
    # DFlash2: the lattice's spine is the selector's greedy walk
    make_tiny_drafter(target.config, directory=tmp_path, block_size=BLOCK, family="dflash2")
    drafter = load_drafter(tmp_path)
    chain, tree = (run(target, drafter, prompts, method) for method in (ChainVerify(), TreeVerify(BLOCK - 1, 1)))
    assert [r.acceptance_lengths for r in tree] == [r.acceptance_lengths for r in chain]


def test_sampled_requests_draw_the_chains_tokens_with_one_candidate(family):
    name, target, prompts, references = family
    params = [SamplingParams(max_new_tokens=16, temperature=1.0, top_k=20, seed=i) for i in range(len(prompts))]
    oracle = lambda: near_miss_oracle(target, prompts, references)  # noqa: E731
    chain = generate(target, oracle(), prompts, params, BLOCK, ChainVerify())
    tree = generate(target, oracle(), prompts, params, BLOCK, TreeVerify(BLOCK - 1, 1))
    alone = [generate(target, None, [p], q, 1)[0] for p, q in zip(prompts, params)]
    assert [r.token_ids for r in tree] == [r.token_ids for r in chain] == [r.token_ids for r in alone]


# -- the drafter's context after a tree step ----------------------------------------------------------------------
@pytest.mark.parametrize("drafter_settings", [{}, {"sliding_window": 3}], ids=["full", "sliding-drafter"])
def test_the_drafter_context_is_the_committed_sequence(drafter_settings):
    """After tree steps whose accepted paths run through siblings, the real drafter (underneath the oracle)
    proposes exactly what a fresh drafter proposes from the committed sequence's features alone."""
    _, target, prompts, references = family_data("llama")
    oracle = near_miss_oracle(target, prompts, references, **drafter_settings)
    results = run(target, oracle, prompts, TreeVerify(16, 4))
    assert_plain_tokens(results, references)
    assert any(max(r.acceptance_lengths) > 1 for r in results)
    layer_ids = oracle.config.target_layer_ids
    fresh = make_tiny_drafter(target.config, block_size=BLOCK, **drafter_settings)
    fresh.load_state_dict(oracle.state_dict())
    checked = 0
    for seq, start, length, proposal in oracle.records:
        full = oracle.references[seq]
        if start == len(prompts[seq]) or length < 2:
            continue  # the first draft of a request sees its prompt: nothing committed by a tree yet
        tokens = torch.tensor([full[:start]])
        cache = target.new_cache()
        features = target.forward(tokens, torch.arange(start)[None], torch.ones_like(tokens), cache, layer_ids).features
        block = torch.full((1, length), oracle.config.mask_token_id)
        block[0, 0] = full[start]
        expected = fresh.propose(target, block, features, torch.tensor([start]), fresh.new_cache(1, start + BLOCK),
                                 top_k=4)
        torch.testing.assert_close(proposal.topk_logprobs[:length - 1], expected.topk_logprobs[0], rtol=1e-4,
                                   atol=1e-4)
        checked += 1
    assert checked > 10


# -- broken on purpose: each must change the tokens -----------------------------------------------------------------
class SiblingsVisible(TreeVerify):
    def layout(self, batch, block, block_lens, proposal):
        verify = super().layout(batch, block, block_lens, proposal)
        width = verify.tokens.shape[1]
        verify.block_mask = torch.ones(width, width, dtype=torch.bool).tril()[None].repeat(len(block), 1, 1)
        return verify


class PositionsBySlot(TreeVerify):
    def layout(self, batch, block, block_lens, proposal):
        verify = super().layout(batch, block, block_lens, proposal)
        verify.positions = batch.next_pos[:, None] + torch.arange(verify.tokens.shape[1])[None]
        return verify


class PrefixCompaction(TreeVerify):
    def accept(self, logits, verify, proposal, batch):
        accepted = super().accept(logits, verify, proposal, batch)
        accepted.keep = None  # keeps the first slots, as a chain would
        return accepted


@pytest.mark.parametrize("broken", [SiblingsVisible, PositionsBySlot, PrefixCompaction])
def test_a_broken_tree_changes_the_tokens(broken):
    _, target, prompts, references = family_data("qwen3-sliding")
    results = run(target, near_miss_oracle(target, prompts, references), prompts, broken(16))
    assert [r.token_ids for r in results] != references


# -- entry points and refusals --------------------------------------------------------------------------------------
def test_methods_by_name_and_by_budget():
    assert isinstance(verify_method("tree", budget=8), TreeVerify)
    assert isinstance(tree_or_chain(0), ChainVerify)
    tree = tree_or_chain(32, 4)
    assert (tree.budget, tree.top_k) == (32, 4)
    assert tree_or_chain(32).top_k == 8
    with pytest.raises(DFlashError, match="tree budget must be >= 1"):
        TreeVerify(0)
    with pytest.raises(DFlashError, match="tree top-k must be >= 1"):
        TreeVerify(8, 0)
    with pytest.raises(DFlashError, match="--tree-top-k needs --tree-budget"):
        tree_or_chain(0, 4)


def test_a_drafter_without_top_k_and_a_static_cache_are_refused(family):
    _, target, prompts, references = family
    drafter = make_tiny_drafter(target.config, block_size=BLOCK)
    drafter.proposes_top_k = False
    with pytest.raises(DFlashError, match="needs each slot's top-K candidates, which this DFlashDrafter"):
        Scheduler(target, drafter, BLOCK, method=TreeVerify(8))

    class Static(TargetModel):
        takes_explicit_masks = False

    with pytest.raises(DFlashError, match="needs explicit attention masks, which this Static does not run"):
        Scheduler(Static(target.model), make_tiny_drafter(target.config, block_size=BLOCK), BLOCK,
                  method=TreeVerify(8))


def test_a_tree_reserves_its_verify_slots(family):
    _, target, prompts, _ = family
    scheduler = Scheduler(target, make_tiny_drafter(target.config, block_size=BLOCK), BLOCK, method=TreeVerify(40))
    scheduler.add_request(prompts[0], SamplingParams(max_new_tokens=5), request_id=0)
    assert scheduler.waiting[0].reserved_tokens == len(prompts[0]) + 5 + 41
