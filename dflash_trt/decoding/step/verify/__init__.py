"""Verification methods: how a proposal is laid out for the target's verify forward, and what is accepted.

A method is one file here behind the `VerifyMethod` protocol, registered in METHODS:
- `layout` turns a row's block (its last committed token, then the drafts) into the verify forward's input:
  tokens, positions, and which of the new slots each new slot attends to (None: causal, a chain);
- `accept` reads the target's logits over that input and decides, per row, how many drafts are accepted, the
  target's bonus token after them, and which new slots the KV cache keeps (None: a prefix of the slots).
The step (step.py) runs the forward and commits; the KV caches take the mask and keep arbitrary slots
(model/kv_cache.py: prepare(..., block_mask) and keep). The chain (chain.py) is the DFlash paper's method.
"""

from __future__ import annotations

from dflash_trt.decoding.step.verify.base import Accepted, VerifyInput, VerifyMethod
from dflash_trt.decoding.step.verify.chain import ChainVerify

__all__ = ["Accepted", "ChainVerify", "METHODS", "VerifyInput", "VerifyMethod", "verify_method"]

# name -> class; a new method is one file and one row here.
METHODS: dict[str, type] = {"chain": ChainVerify}


def verify_method(name: str) -> VerifyMethod:
    if name not in METHODS:
        raise ValueError(f"unknown verification method {name!r} (known: {', '.join(sorted(METHODS))})")
    return METHODS[name]()
