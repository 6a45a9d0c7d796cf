"""Tree verification: one target forward checks the B most probable continuations of the drafter's block, not
just its top-1 chain, so a near-miss of the drafter no longer ends the step.

Building the tree (per row, from the one drafter forward): slot j offers its top-K tokens with log-probs (DFlash:
the slot's marginal; DFlash2: the selector's ranking after the node's own parent token, its lattice). A prefix
u_1..u_d scores sum_i log q_i(u_i); a child never outscores its parent, so the B best prefixes form a tree and a
best-first search finds them: pop the best prefix, push its next sibling and its first child. The greedy spine
(rank 0 at every depth) is reserved first, so a tree never accepts less than the chain. Ties are broken by the
rank path, so the tree is deterministic. Nodes come out parents first; siblings hold distinct tokens.

The verify forward: slot 0 is the root (the last committed token), then the nodes; node i sits at position
next_pos + depth_i and sees its ancestors and itself (on sliding layers, measured between positions). Rows
with fewer nodes are padded with dummy nodes that see only themselves; nothing reads their outputs. On the static
(CUDA-graph) cache every row is padded further, to a bucket of node counts (powers of two up to the budget), so a
graph per bucket is captured.

Acceptance walks from the root: at each node the target's choice (its argmax, or for a sampled request the keyed
sample of output index len(tokens so far) + depth, sampling.choose_keyed) is looked up among the node's children;
the walk follows the child that holds it and stops at the first node whose choice is not a child: that choice is
the bonus. Siblings are distinct, so the walk is unique. The tree depends only on the drafter, fixed before the
target's draws, so each committed token is a sample of the target given the committed prefix: lossless at any
temperature (for DFlash2's sampled drafts too: the tree ignores its q). Logits processors run per visited node
with that node's own prefix. The cache then keeps [root, path...] (Accepted.keep): one gather per layer.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable

import torch

from dflash_trt.decoding.model.graphs.static_kv_cache import tree_nodes_bucket
from dflash_trt.decoding.model.protocols import Proposal
from dflash_trt.decoding.step import logits_processors
from dflash_trt.decoding.step.sampling import choose_keyed
from dflash_trt.decoding.step.tree_budget import check_tree_budget
from dflash_trt.decoding.step.verify.base import Accepted, VerifyInput
from dflash_trt.decoding.step.verify.chain import ChainVerify
from dflash_trt.errors import DFlashError

# children(slot, parent_token) -> (ids, logprobs) of block slot `slot` (0-based: depth slot + 1), best first.
Children = Callable[[int, int], tuple[list[int], list[float]]]


@dataclass
class Tree:
    """One row's tree, root excluded: node i (0-based) holds tokens[i] at depths[i] (>= 1) under parents[i]
    (-1: the root, else an earlier node's index)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int, depth: int) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(depth)
        return len(self.tokens) - 1

    def path(self, node: int) -> list[int]:
        """Node indices from depth 1 down to `node`."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


def build_tree(children: Children, anchor: int, max_depth: int, budget: int) -> Tree:
    """The `budget` best prefixes of at most `max_depth` tokens after `anchor` (module docstring), with the
    greedy spine reserved first. A prefix's key is (-score, rank path): scores are summed from the root in
    that order, and the rank path breaks exact ties (a parent's is a prefix of its child's, so it sorts first)."""
    tree = Tree()
    if budget <= 0 or max_depth <= 0:
        return tree
    # The spine: rank 0 at every depth, as far as the budget reaches.
    spine: dict[tuple[int, ...], int] = {}  # rank path -> node index
    token, parent = anchor, -1
    for depth in range(1, min(budget, max_depth) + 1):
        token = children(depth - 1, token)[0][0]
        parent = tree.add(token, parent, depth)
        spine[(0,) * depth] = parent
    # Best-first over everything else: heap entries (-score, rank path, parent node, parent token, parent score);
    # a spine node pops like any other (its sibling and child still enter) but is already in the tree.
    heap = [(-children(0, anchor)[1][0], (0,), -1, anchor, 0.0)]
    while heap and len(tree) < budget:
        negative, ranks, parent, parent_token, parent_score = heapq.heappop(heap)
        depth, rank = len(ranks), ranks[-1]
        ids, logprobs = children(depth - 1, parent_token)
        node = spine.get(ranks)
        if node is None:
            node = tree.add(ids[rank], parent, depth)
        if rank + 1 < len(ids):  # the next sibling
            heapq.heappush(heap, (-(parent_score + logprobs[rank + 1]), ranks[:-1] + (rank + 1,), parent,
                                  parent_token, parent_score))
        if depth < max_depth:  # the first child
            score = -negative
            heapq.heappush(heap, (-(score + children(depth, ids[rank])[1][0]), ranks + (0,), node, ids[rank], score))
    return tree


@dataclass
class TreeInput(VerifyInput):
    """A tree verify forward: VerifyInput plus each row's tree (new slot i + 1 holds node i)."""

    trees: list[Tree] = field(default_factory=list)


class TreeVerify:
    """Tree verification with a node budget and top-K candidates per slot (module docstring); a VerifyMethod.

    budget: draft nodes per row (the verify forward has budget + 1 slots per row); top_k: candidates per slot
    (default min(budget, 8)); the tree never goes deeper than the step's block size - 1.
    """

    name = "tree"

    def __init__(self, budget: int = 16, top_k: int | None = None):
        if check_tree_budget(budget) < 1:
            raise DFlashError(f"tree budget must be >= 1 (0 means the chain), got {budget}")
        if top_k is not None and top_k < 1:
            raise DFlashError(f"tree top-k must be >= 1, got {top_k}")
        self.budget = budget
        self.top_k = top_k if top_k is not None else min(budget, 8)
        self._chain = ChainVerify()

    @property
    def draft_top_k(self) -> int:
        """Candidates per slot the drafter must propose (0 for a chain)."""
        return self.top_k

    def verify_slots(self, block_size: int) -> int:
        """New KV slots a row may write in one verify forward."""
        return max(block_size, self.budget + 1)

    def check(self, target, drafter) -> None:
        """Refuse, in one line, a target or drafter that cannot run a tree."""
        if not target.takes_explicit_masks:
            raise DFlashError(f"tree verification needs explicit attention masks, which this {type(target).__name__} "
                              "does not run; use the torch target or --tree-budget 0")
        if drafter is not None and not drafter.proposes_top_k:
            raise DFlashError(f"tree verification needs each slot's top-K candidates, which this "
                              f"{type(drafter).__name__} does not propose; use --runtime torch or --tree-budget 0")

    def layout(self, batch, block: torch.Tensor, block_lens: torch.Tensor, proposal: Proposal | None
               ) -> VerifyInput:
        if proposal is None or block.shape[1] < 2:  # a plain step (block size 1): nothing to branch
            return self._chain.layout(batch, block, block_lens, proposal)
        trees = [build_tree(_row_children(proposal, row), int(block[row, 0]), int(length) - 1, self.budget)
                 for row, length in enumerate(block_lens.tolist())]
        nodes = max(len(tree) for tree in trees)
        if batch.cache.static_shapes:  # the static (CUDA-graph) verify: one captured width per bucket of nodes
            nodes = tree_nodes_bucket(nodes, self.budget)
        width = 1 + nodes
        rows, device = len(trees), block.device
        tokens = block[:, :1].repeat(1, width)  # dummies hold the anchor; their outputs are never read
        depths = torch.zeros(rows, width, dtype=torch.long)
        mask = torch.eye(width, dtype=torch.bool).repeat(rows, 1, 1)  # every slot sees itself; dummies only that
        for row, tree in enumerate(trees):
            n = len(tree)
            mask[row, 1:n + 1, 0] = True  # every node sees the root
            tokens[row, 1:n + 1] = torch.tensor(tree.tokens, dtype=torch.long, device=device)
            depths[row, 1:n + 1] = torch.tensor(tree.depths)
            for node, parent in enumerate(tree.parents):
                if parent >= 0:  # a node sees what its parent sees (parents come first)
                    mask[row, node + 1] |= mask[row, parent + 1]
        positions = batch.next_pos[:, None] + depths.to(device)
        lengths = torch.tensor([1 + len(tree) for tree in trees], device=device)
        return TreeInput(tokens, positions, lengths, mask.to(device), trees)

    def accept(self, logits: torch.Tensor, verify: VerifyInput, proposal: Proposal | None, batch) -> Accepted:
        if not isinstance(verify, TreeInput):
            return self._chain.accept(logits, verify, proposal, batch)
        greedy = torch.argmax(logits, dim=-1).tolist()  # [B][N]; rows with processors or sampling redo theirs
        num_accepted, bonus, drafts, keeps = [], [], [], []
        for row, (tree, request) in enumerate(zip(verify.trees, batch.requests)):
            path, token = _walk(tree, logits[row], greedy[row], request)
            num_accepted.append(len(path))
            bonus.append(token)
            drafts.append([tree.tokens[node] for node in path])
            keeps.append([0] + [node + 1 for node in path])
        width = max(len(keep) for keep in keeps)
        keep = torch.tensor([k + [0] * (width - len(k)) for k in keeps], device=logits.device)
        return Accepted(torch.tensor(num_accepted, device=logits.device), torch.tensor(bonus, device=logits.device),
                        drafts, keep)


def _row_children(proposal: Proposal, row: int) -> Children:
    if proposal.children is not None:  # DFlash2: each parent ranks its own children
        return lambda slot, parent_token: proposal.children(row, slot, parent_token)
    if proposal.topk_ids is None:
        raise DFlashError("tree verification needs the drafter's per-slot top-K candidates (propose(..., top_k=K)); "
                          "this proposal has none")
    ids, logprobs = proposal.topk_ids[row].tolist(), proposal.topk_logprobs[row].float().tolist()
    return lambda slot, parent_token: (ids[slot], logprobs[slot])  # marginals: the same for every parent


def _walk(tree: Tree, logits: torch.Tensor, greedy: list[int], request) -> tuple[list[int], int]:
    """(the accepted path's node indices, the bonus token) of one row; logits [N, V] over its slots."""
    params = request.params
    plain = params.is_greedy and not params.has_logits_processors
    generated = len(request.result.token_ids)
    history = request.prompt + request.result.token_ids if params.has_logits_processors else []
    kids: dict[int, dict[int, int]] = {}  # node (-1: root) -> {token: child}
    for node, parent in enumerate(tree.parents):
        kids.setdefault(parent, {})[tree.tokens[node]] = node
    path: list[int] = []
    node = -1
    while True:
        slot, depth = node + 1, len(path)
        if plain:
            choice = greedy[slot]
        else:
            row = logits[slot:slot + 1]
            if params.has_logits_processors:  # this node's own prefix: history + the path's tokens
                row = logits_processors.process(row, params, history + [tree.tokens[n] for n in path],
                                                generated + depth)
            # Output index generated + depth: what the chain draws at this depth, so K = 1 is the chain.
            choice = int(choose_keyed(row, params, request.seed, generated + depth)[0])
        child = kids.get(node, {}).get(choice)
        if child is None:
            return path, choice
        path.append(child)
        node = child
