"""Training loop of a DFlash drafter on cached target features (resumable, logged, time-bounded)."""

from __future__ import annotations

import copy
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from dflash_trt.decoding.model.config import FAMILY_ARCHITECTURE, DrafterConfig
from dflash_trt.decoding.model.drafters import DrafterBase, build_drafter, save_drafter
from dflash_trt.training.recipe import block_loss, build_batch, sample_anchors

STATE_NAME = "train_state.pt"
PRECISIONS = ("auto", "bf16", "fp32")
ARCHS = tuple(FAMILY_ARCHITECTURE)  # "dflash", "dflash2"


@dataclass
class TrainConfig:
    """Drafter shape and optimisation settings (defaults: the SmolLM2-135M demo drafter)."""

    data: str = "out/drafter-data"
    out: str = "out/drafter-train"
    prompts: str = "data/prompts"
    target: str = "smollm2"
    num_layers: int = 2
    block_size: int = 8
    # Drafter family: "dflash", or "dflash2" (convolutions start as the identity and the successor
    # codebook at zero, so training starts from DFlash behaviour).
    arch: str = "dflash"
    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 32
    selector_top_k: int = 16
    target_layer_ids: tuple[int, ...] = (1, 8, 14, 20, 27)
    mask_token_id: int = 4
    intermediate_size: int = 1536
    gamma: float = 4.0
    lr: float = 1e-3
    warmup_steps: int = 30
    weight_decay: float = 0.01
    batch_size: int = 4
    blocks_per_seq: int = 32
    # "data": the loss's softmax runs over the tokens present in the training samples only (a few
    # thousand rows of the 49k-row head), which makes CPU training several times cheaper; "full":
    # the whole vocabulary. Inference always uses the full head.
    train_vocab: str = "data"
    # With train_vocab "data": this many other head rows, drawn at random every step, join the
    # softmax, so tokens absent from the data are pushed down too (the full head runs at inference).
    negatives: int = 4096
    # Divide each feature dimension by its RMS over the data while training (folded back into
    # fc.weight on export, so the checkpoint is unchanged in form). Llama-style targets carry a few
    # "massive activation" dimensions (RMS ~2000 vs ~5 for the rest) that otherwise drown the fc input.
    feature_scale: bool = True
    max_steps: int = 4000
    max_minutes: float = 55.0
    eval_every: int = 400
    eval_prompts_per_family: int = 1
    eval_max_new_tokens: int = 48
    save_every: int = 50
    # Look for new chunks in the feature cache every this many steps (0: never), so training can
    # start while answers are still being generated; only chunks with unseen samples are read.
    refresh_every: int = 100
    # Times each sample of a family appears per epoch (others: once), e.g. {"sharegpt-chat": 4}:
    # a few hundred answers of a new source otherwise drown among thousands of template answers.
    family_repeats: dict[str, int] = field(default_factory=dict)
    seed: int = 0
    threads: int = 1
    # Compute dtype of the drafter's forward and backward: "bf16" (autocast; master weights and the
    # optimiser stay fp32), "fp32", or "auto" = bf16 where the CPU computes it natively (AVX512-BF16 or
    # AMX: ~1.7x faster steps), fp32 elsewhere (emulated bf16 would be slower).
    precision: str = "auto"
    # Warm start: a published drafter directory whose weights the run starts from (with a fresh
    # optimiser and schedule). Ignored once the run has a state of its own to resume.
    init_from: str | None = None
    stop_token_ids: tuple[int, ...] = field(default_factory=lambda: (2,))


def drafter_config(cfg: TrainConfig, target_config) -> DrafterConfig:
    """Published-format config of a drafter for `target_config` (a Hugging Face config)."""
    d = target_config.hidden_size
    rope = getattr(target_config, "rope_parameters", None) or {}
    return DrafterConfig.from_dict({
        "architectures": [FAMILY_ARCHITECTURE[cfg.arch]], "model_type": "qwen3",
        "hidden_size": d, "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": target_config.num_attention_heads,
        "num_key_value_heads": target_config.num_key_value_heads,
        "head_dim": getattr(target_config, "head_dim", None) or d // target_config.num_attention_heads,
        "vocab_size": target_config.vocab_size, "block_size": cfg.block_size,
        "num_target_layers": target_config.num_hidden_layers,
        "rms_norm_eps": float(target_config.rms_norm_eps),
        "rope_theta": float(rope.get("rope_theta", getattr(target_config, "rope_theta", 10000.0))),
        "rope_scaling": None, "attention_bias": False,
        "max_position_embeddings": target_config.max_position_embeddings, "hidden_act": "silu",
        "tie_word_embeddings": False, "eos_token_id": list(cfg.stop_token_ids),
        "dflash_config": _dflash_settings(cfg),
    })


def _dflash_settings(cfg: TrainConfig) -> dict:
    if cfg.arch not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {cfg.arch!r}")
    settings = {"target_layer_ids": list(cfg.target_layer_ids), "mask_token_id": cfg.mask_token_id}
    if cfg.arch == "dflash2":
        settings.update(block_size=cfg.block_size, conv_kernel_size=cfg.conv_kernel_size,
                        conv_group_size=cfg.conv_group_size, selector_rank=cfg.selector_rank,
                        selector_top_k=cfg.selector_top_k)
    return settings


def feature_rms(samples: list[dict], max_samples: int = 64) -> torch.Tensor:
    """Per-dimension RMS of the features (first position excluded: it is the attention sink), >= 1e-3."""
    rows = torch.cat([s["features"][1:].float() for s in samples[:max_samples]])
    return rows.pow(2).mean(0).sqrt().clamp(min=1e-3)


def lr_at(step: int, cfg: TrainConfig, elapsed_s: float = 0.0) -> float:
    """Linear warmup, then cosine decay to 10% of the peak at max_steps or at the time budget,
    whichever comes first (so a time-bounded run still ends on a low learning rate)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, max((step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps),
                            elapsed_s / 60 / cfg.max_minutes))
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def use_bf16(precision: str) -> bool:
    """Whether training steps run under bf16 autocast for this `precision` setting on this CPU."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be 'auto', 'bf16' or 'fp32', got {precision!r}")
    if precision == "auto":
        from dflash_trt.decoding.kernels.cpu_linear import bf16_packing_available
        return bf16_packing_available()
    return precision == "bf16"


def training_head(head: torch.Tensor, samples: list[dict], mode: str):
    """(head rows used by the loss, map full id -> row or None). Labels always lie in the data vocab."""
    if mode == "full":
        return head, None
    if mode != "data":
        raise ValueError(f"train_vocab must be 'data' or 'full', got {mode!r}")
    ids = torch.unique(torch.cat([s["ids"].long() for s in samples]))
    vocab_map = torch.full((head.shape[0],), -1, dtype=torch.long)
    vocab_map[ids] = torch.arange(len(ids))
    return head[ids], vocab_map


def grown_state_dict(state: dict[str, torch.Tensor], num_layers: int, new_num_layers: int) -> dict[str, torch.Tensor]:
    """A drafter state with `new_num_layers` layers that computes exactly what `state` computes.

    Block expansion (as in LLaMA Pro): layer j of the new drafter copies source layer j * L // L', so each
    source layer is followed by its copies; in a copy the output projections of attention and MLP
    (o_proj, down_proj) are zero, so the copy adds nothing to the residual stream until training moves
    them. A warm start can then add layers and begin from the source drafter's figures, not from scratch.
    """
    if new_num_layers == num_layers:
        return dict(state)
    grown = {k: v for k, v in state.items() if not k.startswith("layers.")}
    for j in range(new_num_layers):
        source = j * num_layers // new_num_layers
        is_copy = j > 0 and (j - 1) * num_layers // new_num_layers == source
        prefix = f"layers.{source}."
        for key, value in state.items():
            if key.startswith(prefix):
                name = key[len(prefix):]
                zero = is_copy and name in ("self_attn.o_proj.weight", "self_attn.o_proj.bias",
                                            "mlp.down_proj.weight")
                grown[f"layers.{j}.{name}"] = torch.zeros_like(value) if zero else value.clone()
    return grown


class Trainer:
    """Owns drafter, optimiser and data order; `run` trains until max_steps or max_minutes."""

    def __init__(self, cfg: TrainConfig, samples: list[dict], embed_weight: torch.Tensor,
                 head_weight: torch.Tensor, target_config, evaluate=None, final_norm_weight=None, refresh=None):
        self.cfg, self.evaluate, self.refresh = cfg, evaluate, refresh
        self.embed, self.full_head = embed_weight.detach(), head_weight.detach()
        self.set_samples(samples)
        unknown = sorted(set(cfg.family_repeats) - {s.get("family") for s in samples})
        if unknown:
            from dflash_trt.errors import ConfigError
            families = sorted({str(s.get("family")) for s in samples})
            raise ConfigError(f"family_repeats names families without samples: {', '.join(unknown)} "
                              f"(the samples' families: {', '.join(families)})")
        torch.manual_seed(cfg.seed)
        self.drafter = build_drafter(drafter_config(cfg, target_config)).train()
        self.drafter.init_as_dflash()
        if final_norm_weight is not None:
            # The drafter's states feed the target's head: start its final norm where the target's is.
            with torch.no_grad():
                self.drafter.norm.weight.copy_(final_norm_weight)
        self.opt = torch.optim.AdamW(self.drafter.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                                     weight_decay=cfg.weight_decay)
        self.step = 0
        self.bf16 = use_bf16(cfg.precision)
        self.scale = feature_rms(samples) if cfg.feature_scale else None
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.order: list[int] = []
        self.out = Path(cfg.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.elapsed = 0.0
        if cfg.init_from and not (self.out / STATE_NAME).exists():
            self._warm_start(cfg.init_from)
        self._resume()

    def set_samples(self, samples: list[dict]) -> None:
        """Train on `samples` from now on (the current epoch's order continues over the old ones)."""
        self.samples = samples
        self.by_idx = {s["idx"]: s for s in samples}
        self.head, self.vocab_map = training_head(self.full_head, samples, self.cfg.train_vocab)
        self.complement = None if self.vocab_map is None else torch.nonzero(self.vocab_map < 0).flatten()
        # Vocabulary id of each row of self.head (the DFlash2 selector scores rows by token id).
        self.head_ids = (torch.arange(self.full_head.shape[0]) if self.vocab_map is None
                         else torch.nonzero(self.vocab_map >= 0).flatten())

    def add_samples(self, new: list[dict]) -> None:
        """Add samples that appeared while training (answers still being generated)."""
        if not new:
            return
        self.set_samples(sorted(self.samples + new, key=lambda s: s["idx"]))
        # New samples go first (order is popped from the end) in the current epoch.
        self.order += self._epoch_entries(new)
        self._log({"step": self.step, "num_samples": len(self.samples)})

    def _warm_start(self, path: str) -> None:
        """Start from a published drafter (the inverse of `published_drafter`)."""
        from dflash_trt.decoding.model.drafters import load_drafter
        from dflash_trt.errors import ConfigError

        source = load_drafter(path)
        mine, theirs = self.drafter.config, source.config
        for name in ("hidden_size", "intermediate_size", "num_attention_heads",
                     "num_key_value_heads", "block_size", "target_layer_ids", "mask_token_id"):
            if getattr(mine, name) != getattr(theirs, name):
                raise ConfigError(f"{path}: cannot warm-start from it: {name} {getattr(theirs, name)} "
                                  f"!= {getattr(mine, name)} of this run")
        if mine.num_hidden_layers < theirs.num_hidden_layers:
            raise ConfigError(f"{path}: cannot warm-start from it: num_hidden_layers {theirs.num_hidden_layers} "
                              f"> {mine.num_hidden_layers} of this run (a run may add layers, not drop them)")
        state = grown_state_dict(source.state_dict(), theirs.num_hidden_layers, mine.num_hidden_layers)
        if mine.family == theirs.family:
            self.drafter.load_state_dict(state)
        elif (mine.family, theirs.family) == ("dflash2", "dflash"):
            # DFlash2 = DFlash + convolutions + selector: those keep their DFlash-equivalent init
            # (init_as_dflash), so the run starts exactly where the v1 drafter is.
            missing, unexpected = self.drafter.load_state_dict(state, strict=False)
            added = [k for k in missing if not k.startswith("candidate_selector.") and "_conv." not in k]
            if unexpected or added:
                raise ConfigError(f"{path}: cannot warm-start a dflash2 run from it: "
                                  f"unexpected {unexpected}, missing {added}")
        else:
            raise ConfigError(f"{path}: cannot warm-start a {mine.family} run from a {theirs.family} drafter")
        if self.scale is not None:  # published fc reads raw features; training reads features / scale
            with torch.no_grad():
                self.drafter.fc.weight.mul_(self.scale[None, :])

    def _resume(self) -> None:
        path = self.out / STATE_NAME
        if not path.exists():
            return
        state = torch.load(path, weights_only=False)
        self.drafter.load_state_dict(state["drafter"])
        if self.scale is not None and state.get("feature_scale") is None:
            # A run started without feature scaling continues with it: fc(x) == (fc.weight * s)(x / s).
            with torch.no_grad():
                self.drafter.fc.weight.mul_(self.scale[None, :])
        else:
            self.scale = state.get("feature_scale")
            self.opt.load_state_dict(state["optimizer"])
        self.step, self.order, self.elapsed = state["step"], state["order"], state["elapsed"]
        self.generator.set_state(state["generator"])

    def save(self) -> None:
        state = {"drafter": self.drafter.state_dict(), "optimizer": self.opt.state_dict(), "step": self.step,
                 "order": self.order, "elapsed": self.elapsed, "generator": self.generator.get_state(),
                 "config": asdict(self.cfg), "feature_scale": self.scale}
        tmp = self.out / (STATE_NAME + ".tmp")
        torch.save(state, tmp)
        tmp.replace(self.out / STATE_NAME)  # atomic: an interrupted save never corrupts the last one
        save_drafter(self.published_drafter(), self.out / "drafter")

    def published_drafter(self) -> DrafterBase:
        """The drafter as it runs on raw target features (feature scaling folded into fc.weight)."""
        drafter = copy.deepcopy(self.drafter).eval()
        if self.scale is not None:
            with torch.no_grad():
                drafter.fc.weight.div_(self.scale[None, :])
        return drafter

    def _epoch_entries(self, samples: list[dict]) -> list[int]:
        """Sample indices of one epoch over `samples`, each repeated as its family asks."""
        repeats = self.cfg.family_repeats
        return [s["idx"] for s in samples for _ in range(repeats.get(s.get("family"), 1))]

    def _next_samples(self) -> list[dict]:
        picked = []
        while len(picked) < self.cfg.batch_size:
            if not self.order:  # new epoch: deterministic shuffle seeded by the step (sample idx values)
                self.order = self._epoch_entries(self.samples)
                random.Random(self.cfg.seed * 1_000_003 + self.step).shuffle(self.order)
            picked.append(self.by_idx[self.order.pop()])
        return picked

    def train_step(self) -> dict[str, float]:
        samples = self._next_samples()
        anchors = [sample_anchors(s["prompt_len"], len(s["ids"]), self.cfg.blocks_per_seq, self.generator)
                   for s in samples]
        batch = build_batch(samples, anchors, self.cfg.block_size, self.cfg.mask_token_id, self.cfg.gamma)
        if self.scale is not None:
            batch["features"] = batch["features"] / self.scale
        if self.vocab_map is not None:
            batch["labels"] = self.vocab_map[batch["labels"]]
        for group in self.opt.param_groups:
            group["lr"] = lr_at(self.step, self.cfg, self.elapsed)
        head, head_ids = self.head, self.head_ids
        if self.complement is not None and self.cfg.negatives > 0:
            pick = torch.randperm(len(self.complement), generator=self.generator)[:self.cfg.negatives]
            head = torch.cat((self.head, self.full_head[self.complement[pick]]))
            head_ids = torch.cat((self.head_ids, self.complement[pick]))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            loss, stats = block_loss(self.drafter, self.embed, head, batch, head_ids)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), 1.0))
        self.opt.step()
        self.step += 1
        return stats

    def _log(self, record: dict) -> None:
        with open(self.out / "log.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def run(self) -> dict:
        """Train until max_steps or the time budget; saves on the way and at the end."""
        from tqdm import tqdm

        bar = tqdm(total=self.cfg.max_steps, initial=self.step, desc="train drafter")
        start, last = time.time() - self.elapsed, {}
        while self.step < self.cfg.max_steps and (time.time() - start) / 60 < self.cfg.max_minutes:
            stats = self.train_step()
            self.elapsed = time.time() - start
            last = {"step": self.step, "lr": lr_at(self.step - 1, self.cfg, self.elapsed), "elapsed_s": round(self.elapsed, 1),
                    **{k: round(v, 4) for k, v in stats.items()}}
            if self.step % 10 == 0:
                self._log(last)
            if self.evaluate and self.step % self.cfg.eval_every == 0:
                last.update(self.evaluate(self.published_drafter()))
                self._log({"step": self.step, "eval": True, **last})
            if self.step % self.cfg.save_every == 0:
                self.save()
            if self.refresh and self.cfg.refresh_every and self.step % self.cfg.refresh_every == 0:
                self.add_samples(self.refresh(set(self.by_idx)))
            bar.update(1)
            bar.set_postfix(loss=f"{stats['loss']:.3f}", acc1=f"{stats['acc1']:.2f}")
        bar.close()
        self.save()
        return last
