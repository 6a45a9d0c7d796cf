"""The DFlash training recipe: many anchored blocks per sequence in one drafter forward.

For a sequence with target features F[0..T) and anchors a_1..a_N (response positions):
- block n is [token(a_n), MASK x (q-1)] at positions a_n .. a_n+q-1; slot k is labelled with
  token(a_n + k) (same-position labels), weighted by exp(-(k-1)/gamma), slot 0 unweighted;
- block n attends to context rows t < a_n (strictly before the anchor: the anchor's own feature is
  not visible, its token enters through its embedding in slot 0) and bidirectionally to its own
  slots; blocks are invisible to each other.
The forward reuses the modules of the drafter (dflash_trt.decoding.model.drafters: KV injection through the
same k/v projections, DraftAttention.project; RoPE at absolute positions), so a trained state dict is the
published checkpoint as is. The masked attention is the training twin of the cache-based inference path; a test
checks they agree.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dflash_trt.decoding.model.drafters import DrafterBase


def sample_anchors(prompt_len: int, length: int, num_blocks: int, generator: torch.Generator) -> torch.Tensor:
    """Up to num_blocks distinct anchors among response positions that have at least one label."""
    candidates = torch.arange(prompt_len, length - 1)
    if len(candidates) == 0:
        return candidates
    pick = torch.randperm(len(candidates), generator=generator)[:num_blocks]
    return candidates[pick].sort().values


def slot_weights(block_size: int, gamma: float) -> torch.Tensor:
    """Loss weight of each block slot: 0 for the anchor slot, exp(-(k-1)/gamma) for slot k >= 1."""
    k = torch.arange(block_size, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


def build_batch(samples: list[dict], anchors: list[torch.Tensor], block_size: int, mask_token_id: int,
                gamma: float) -> dict[str, torch.Tensor]:
    """Pad a list of cached samples and their anchors into training tensors.

    Returns ids [B,T], features [B,T,K*D], ctx_valid [B,T], block_tokens/labels/weights/positions
    [B,N*q], anchor_of_slot [B,N*q], block_of_slot [B,N*q] (-1 = padding block).
    """
    B, q = len(samples), block_size
    T = max(len(s["ids"]) for s in samples)
    N = max(1, max(len(a) for a in anchors))
    KD = samples[0]["features"].shape[-1]
    ids = torch.zeros(B, T, dtype=torch.long)
    feats = torch.zeros(B, T, KD, dtype=torch.float32)
    ctx_valid = torch.zeros(B, T, dtype=torch.bool)
    anchor = torch.zeros(B, N, dtype=torch.long)
    block_valid = torch.zeros(B, N, dtype=torch.bool)
    for b, (s, a) in enumerate(zip(samples, anchors)):
        n = len(s["ids"])
        ids[b, :n] = s["ids"].long()
        feats[b, :n] = s["features"].float()
        ctx_valid[b, :n] = True
        anchor[b, :len(a)] = a
        block_valid[b, :len(a)] = True
    offs = torch.arange(q)
    pos = anchor[:, :, None] + offs  # [B,N,q]
    lengths = ctx_valid.sum(1)
    in_range = pos < lengths[:, None, None]
    labels = torch.gather(ids, 1, pos.clamp(max=T - 1).view(B, -1)).view(B, N, q)
    tokens = torch.full((B, N, q), mask_token_id, dtype=torch.long)
    tokens[:, :, 0] = torch.gather(ids, 1, anchor)
    weights = slot_weights(q, gamma).expand(B, N, q) * in_range * block_valid[:, :, None]
    block_id = torch.where(block_valid, torch.arange(N).expand(B, N), -1)
    return {
        "features": feats, "ctx_valid": ctx_valid,
        "block_tokens": tokens.view(B, -1), "labels": labels.view(B, -1),
        "label_ids": labels.view(B, -1), "weights": weights.reshape(B, -1),
        "positions": pos.view(B, -1), "anchor_of_slot": anchor[:, :, None].expand(B, N, q).reshape(B, -1),
        "block_of_slot": block_id[:, :, None].expand(B, N, q).reshape(B, -1),
        "slot": offs.repeat(N).expand(B, N * q),
    }


def attention_mask(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[B,1,N*q,T+N*q] bool: context strictly before the slot's anchor, plus the slot's own block."""
    T = batch["ctx_valid"].shape[1]
    ctx = (torch.arange(T)[None, None, :] < batch["anchor_of_slot"][:, :, None]) & batch["ctx_valid"][:, None, :]
    blk = batch["block_of_slot"]
    # Padding blocks (id -1) see each other only: no row is fully masked (that would give NaN gradients).
    own = blk[:, :, None] == blk[:, None, :]
    return torch.cat((ctx, own), dim=2)[:, None]


def _attention(layer, h, ctx, positions, ctx_positions, mask, rope):
    """o_proj(attention) of normed block states h over [context ; own block] (the masked training twin)."""
    attn = layer.self_attn
    B, S, _ = h.shape
    q, k, v, ck, cv = attn.project(h, ctx)  # the inference path's own projections (KV injection)
    cos, sin = rope.cos_sin(positions)
    q = rope.apply(q, cos[:, :, None], sin[:, :, None])
    k = rope.apply(k, cos[:, :, None], sin[:, :, None])
    cos, sin = rope.cos_sin(ctx_positions)
    ck = rope.apply(ck, cos[:, :, None], sin[:, :, None])
    keys = torch.cat((ck, k), dim=1).transpose(1, 2)
    values = torch.cat((cv, v), dim=1).transpose(1, 2)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=True)
    return attn.o_proj(out.transpose(1, 2).reshape(B, S, -1))


def _block_conv(conv, u, coefficients, side, block_size):
    """A DFlash2 convolution over each block of the [B, N*q, D] layout separately (it never crosses blocks)."""
    B, S, D = u.shape
    blocks = u.reshape(B, S // block_size, block_size, D)
    coefficients = coefficients.reshape(B, S // block_size, block_size, *coefficients.shape[2:])
    return conv.apply(blocks, coefficients, side).reshape(B, S, D)


def _layer_forward(layer, x, ctx, positions, ctx_positions, mask, rope, block_size, family):
    h = layer.input_layernorm(x)
    if family == "dflash":
        x = x + _attention(layer, h, ctx, positions, ctx_positions, mask, rope)
        return x + layer.mlp(layer.post_attention_layernorm(x))
    delta = layer.attention_conv.coefficients(h)  # DFlash2: convolutions around attention and MLP
    a = _attention(layer, _block_conv(layer.attention_conv, h, delta, 0, block_size), ctx, positions,
                   ctx_positions, mask, rope)
    x = x + _block_conv(layer.attention_conv, a, delta, 1, block_size)
    m = layer.post_attention_layernorm(x)
    delta = layer.mlp_conv.coefficients(m)
    y = layer.mlp(_block_conv(layer.mlp_conv, m, delta, 0, block_size))
    return x + _block_conv(layer.mlp_conv, y, delta, 1, block_size)


def drafter_block_states(drafter: DrafterBase, embed_weight: torch.Tensor, batch: dict) -> torch.Tensor:
    """Final-normed drafter states [B,N*q,D] of every block slot in the batch."""
    ctx = drafter.fuse_context(batch["features"])
    x = F.embedding(batch["block_tokens"], embed_weight)
    T = ctx.shape[1]
    ctx_positions = torch.arange(T).expand(ctx.shape[0], T)
    mask = attention_mask(batch)
    for layer in drafter.layers:
        x = _layer_forward(layer, x, ctx, batch["positions"], ctx_positions, mask, drafter.rope,
                           drafter.config.block_size, drafter.family)
    return drafter.norm(x)


def _predecessors(batch: dict) -> torch.Tensor:
    """Token before each slot on the reference path: the anchor for slot 1, else the previous slot's label."""
    before_tokens = torch.roll(batch["block_tokens"], 1, dims=1)
    before_labels = torch.roll(batch["label_ids"], 1, dims=1)
    return torch.where(batch["slot"] == 1, before_tokens, before_labels)


def _transition_scores(selector, states, previous, head_ids):
    """DFlash2's selector term sum_r A[previous, r] P[r] B[v, r] for every head row v (teacher forced)."""
    left = selector.predecessor_codebook[previous] * selector.hidden_projection(states)
    return F.linear(left, selector.successor_codebook[head_ids])


def block_loss(drafter: DrafterBase, embed_weight: torch.Tensor, head_weight: torch.Tensor,
               batch: dict, head_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted cross-entropy over the labelled slots; the lm_head runs only where the weight is > 0.

    DFlash2 (head_ids: the vocabulary id of each head row; batch["label_ids"]: labels as vocabulary ids):
    the scores are the selector's, logit + transition from the reference path's previous token, so the
    codebooks learn which continuation follows which token.
    """
    states = drafter_block_states(drafter, embed_weight, batch)
    w = batch["weights"]
    sel = w > 0
    logits = F.linear(states[sel], head_weight)
    if drafter.family == "dflash2" and head_ids is not None:
        logits = logits + _transition_scores(drafter.candidate_selector, states[sel], _predecessors(batch)[sel],
                                             head_ids)
    labels = batch["labels"][sel]
    ce = F.cross_entropy(logits.float(), labels, reduction="none")
    loss = (ce * w[sel]).sum() / w[sel].sum().clamp(min=1e-6)
    with torch.no_grad():
        correct = (logits.argmax(-1) == labels).float()
        first = batch["slot"][sel] == 1
        stats = {"loss": float(loss), "acc": float(correct.mean()) if len(correct) else math.nan,
                 "acc1": float(correct[first].mean()) if first.any() else math.nan}
    return loss, stats
