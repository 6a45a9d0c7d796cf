"""Verification methods: how a proposal is laid out for the target's verify forward, and what is accepted.

A method is one file here behind the `VerifyMethod` protocol, registered in METHODS:
- `layout` turns a row's block (its last committed token, then the drafts) into the verify forward's input:
  tokens, positions, and which of the new slots each new slot attends to (None: causal, a chain);
- `accept` reads the target's logits over that input and decides, per row, how many drafts are accepted, the
  target's bonus token after them, and which new slots the KV cache keeps (None: a prefix of the slots).
A method also says how many candidates per slot it needs from the drafter (`draft_top_k`), how many KV slots a
verify may write (`verify_slots`), and refuses a target or drafter it cannot run (`check`).
The step (step.py) runs the forward and commits; the KV caches take the mask and keep arbitrary slots
(model/kv_cache.py: prepare(..., block_mask) and keep). The chain (chain.py) is the DFlash paper's method; the
tree (tree.py) verifies the drafter's B most probable continuations in one forward.
"""

from __future__ import annotations

from dflash_trt.decoding.step.tree_budget import check_tree_budget
from dflash_trt.decoding.step.verify.base import Accepted, VerifyInput, VerifyMethod
from dflash_trt.decoding.step.verify.chain import ChainVerify
from dflash_trt.decoding.step.verify.tree import TreeVerify
from dflash_trt.errors import DFlashError

__all__ = ["Accepted", "ChainVerify", "METHODS", "TreeVerify", "VerifyInput", "VerifyMethod", "check_tree_budget",
           "tree_or_chain", "verify_method"]

# name -> class; a new method is one file and one row here.
METHODS: dict[str, type] = {"chain": ChainVerify, "tree": TreeVerify}


def verify_method(name: str, **settings) -> VerifyMethod:
    """The method `name` built with `settings` (TreeVerify: budget, top_k)."""
    if name not in METHODS:
        raise DFlashError(f"unknown verification method {name!r} (known: {', '.join(sorted(METHODS))})")
    return METHODS[name](**settings)


def tree_or_chain(tree_budget: int = 0, tree_top_k: int | None = None) -> VerifyMethod:
    """What --tree-budget B [--tree-top-k K] means: the chain for B = 0, else a tree of B nodes."""
    if check_tree_budget(tree_budget) == 0:
        if tree_top_k is not None:
            raise DFlashError("--tree-top-k needs --tree-budget B > 0")
        return ChainVerify()
    return TreeVerify(tree_budget, tree_top_k)
