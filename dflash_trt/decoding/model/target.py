"""Adapter over a Hugging Face causal LM: prefill/verify with its KV cache and layer features.

The feature of target layer l is the residual stream at the OUTPUT of decoder layer l (before the final
norm), i.e. Hugging Face's hidden_states[l + 1]. It is captured with forward hooks on the decoder layers
rather than output_hidden_states, so only the layers the drafter reads are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from dflash_trt.decoding.kernels.cpu_linear import BF16Head, bf16_packing_available, pack_linear_layers
from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.decoding.model.graphs.static_kv_cache import StaticKVCache
from dflash_trt.decoding.model.kv_cache import GROUPED_SDPA, BatchKVCache, MaskSpec, register_grouped_sdpa
from dflash_trt.errors import CompatibilityError, ConfigError


@dataclass
class TargetOutput:
    logits: torch.Tensor  # [B,T,V] fp32 (T = 1 when only the last position was asked for)
    features: torch.Tensor | None  # [B,T,K*D], target layers concatenated in order


class TargetModel:
    """A frozen target model, plus its tokenizer when one is available."""

    takes_explicit_masks = True  # BatchKVCache.prepare builds any block mask (tree verification)

    def __init__(self, model: nn.Module, tokenizer=None, source: str = "target"):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.source = source
        self.config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.layers = _decoder_layers(model, source)
        self._draft_head: nn.Module | None = None
        # The attention every forward runs, when not the model's own: ROWWISE (batch-invariant) for a target at
        # its GGUF precision, set by load_target.
        self.attention_override: str | None = None
        # The native decoder forward (lean_llama.py) of a Llama target at its GGUF precision, which runs every
        # forward over a batch cache (decoding steps, verify forwards); set by use_lean_forward.
        self.lean = None
        # "gguf" when the linear layers run at the GGUF's own precision (load_target), else "float".
        self.weights = "float"
        register_grouped_sdpa()

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.get_input_embeddings().weight.shape[0]

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def max_context(self) -> int | None:
        return getattr(self.config, "max_position_embeddings", None)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(token_ids)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(hidden)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Output-head logits of drafter states: the target's head, or its bf16 copy (use_bf16_draft_head)."""
        if self._draft_head is not None:
            return self._draft_head(hidden)
        return self.lm_head(hidden.to(self.model.get_input_embeddings().weight.dtype))  # a drafter may run in bf16

    def use_bf16_draft_head(self) -> bool:
        """Draft through a bf16 copy of the output head where the CPU computes bf16 natively.

        Lossless: drafts are only proposals that the (unchanged) target verifies. Returns whether it applies.
        """
        head = self.model.get_output_embeddings()
        if (head is None or not isinstance(head, nn.Linear) or head.bias is not None
                or head.weight.device.type != "cpu"
                or head.weight.dtype != torch.float32 or not bf16_packing_available()):
            return False
        self._draft_head = BF16Head(head.weight)
        return True

    def use_rowwise_attention(self) -> None:
        """Run every forward's attention batch-invariantly (kernels/rowwise_attention.py): with the GGUF-precision
        linear layers, a token's outputs then do not depend on how many tokens are computed with it."""
        from dflash_trt.decoding.kernels.rowwise_attention import ROWWISE, register_rowwise_attention

        if self.config._attn_implementation != "sdpa":
            raise ConfigError(f"{self.source}: rowwise attention replaces sdpa attention, not "
                              f"{self.config._attn_implementation!r}")
        register_rowwise_attention()
        self.attention_override = ROWWISE

    def use_lean_forward(self) -> str:
        """Run the forwards over a batch cache through lean_llama.LeanLlama (the same logits, bit for bit, without
        transformers' per-layer Python) where it applies; returns "" then, else why not (the model's forward runs)."""
        from dflash_trt.decoding.model.lean_llama import LeanLlama

        self.lean, reason = LeanLlama.build(self.model)
        return reason

    def new_cache(self):
        # A plain DynamicCache keeps every position in every layer (also sliding-window ones); prefill through
        # transformers' forward uses it (the model builds its masks from a 2D padding mask), then batch_cache takes
        # it over. (With the native decoder, prefill writes an empty_batch_cache instead.)
        from transformers import DynamicCache
        return DynamicCache()

    def empty_batch_cache(self, rows: int, capacity: int, capacity_limit: int) -> BatchKVCache:
        """A decoding cache of `rows` empty rows with `capacity` slots each (growing up to capacity_limit), in the
        dtype and on the device the model's forwards write its keys and values."""
        embedding = self.model.get_input_embeddings().weight
        spec = MaskSpec.from_config(self.config, embedding.dtype)
        heads = self.config.num_key_value_heads
        head_dim = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.config.num_attention_heads

        def buffers() -> list[torch.Tensor]:
            return [embedding.new_zeros(rows, heads, capacity, head_dim) for _ in range(self.num_layers)]

        lengths = torch.zeros(rows, dtype=torch.long, device=embedding.device)
        return BatchKVCache(buffers(), buffers(), lengths, spec, capacity_limit)

    def batch_cache(self, prefill_cache, lengths: torch.Tensor, capacity_limit: int,
                    cache_type: type[BatchKVCache] = BatchKVCache) -> BatchKVCache:
        """The decoding cache of a prefilled group: rows of `prefill_cache` (a cache from new_cache, rows
        left-padded to a common width, row b holding lengths[b] tokens) realigned to the left, with room to
        grow up to capacity_limit slots per row. cache_type: BatchKVCache, or StaticKVCache (GraphedVerifier)."""
        spec = MaskSpec.from_config(self.config, self.model.get_input_embeddings().weight.dtype)
        keys = [layer.keys for layer in prefill_cache.layers]
        values = [layer.values for layer in prefill_cache.layers]
        return cache_type.from_left_padded(keys, values, lengths, spec, capacity_limit)

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                cache, feature_layer_ids: Sequence[int] = (), last_only: bool = False,
                logits_at: torch.Tensor | None = None) -> TargetOutput:
        """Run the target on new tokens [B,T] at position_ids [B,T].

        With a cache from new_cache, attention_mask [B, cached + T] marks the valid cache slots (0 = left
        padding); with a BatchKVCache, it is what the cache's `prepare(T)` returned. logits_at [B]: the logits
        [B, 1, V] of one column per row only (right-padded prompts prefilled by the native decoder, whose last
        tokens sit in different columns).
        """
        if isinstance(cache, StaticKVCache):
            raise RuntimeError("a StaticKVCache is run by GraphedVerifier.forward")  # internal invariant
        if logits_at is not None:
            if self.lean is None or not isinstance(cache, BatchKVCache):
                raise RuntimeError("logits_at is for the native decoder's forwards")  # internal invariant
            logits, features = self.lean.forward(token_ids, position_ids, attention_mask, cache, feature_layer_ids,
                                                 logits_at=logits_at)
        else:
            logits, features = self.run_model(token_ids, position_ids, attention_mask, cache, feature_layer_ids,
                                              last_only)
        return TargetOutput(logits.float(), features)

    def run_model(self, token_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask, cache,
                  feature_layer_ids: Sequence[int] = (), last_only: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The model's forward as `forward` runs it: logits in the model's dtype, and the features. With explicit
        masks and a batch cache it reads nothing on the host, so a CUDA graph can capture it (graphs/verifier.py).
        """
        if (self.lean is not None and isinstance(cache, BatchKVCache) and not cache.static_shapes
                and isinstance(attention_mask, torch.Tensor)):
            return self.lean.forward(token_ids, position_ids, attention_mask, cache, feature_layer_ids, last_only)
        captured: dict[int, torch.Tensor] = {}
        hooks = [self.layers[i].register_forward_hook(_capture(captured, i)) for i in feature_layer_ids]
        # Over a batch cache, sdpa runs as grouped_sdpa (kv_cache.py), for this forward only; a GGUF-precision
        # target runs the batch-invariant rowwise attention in every forward.
        attention = self.config._attn_implementation
        override = self.attention_override or (
            GROUPED_SDPA if isinstance(cache, BatchKVCache) and attention == "sdpa" else None)
        try:
            if override:
                self.config._attn_implementation = override
            out = self.model(input_ids=token_ids, position_ids=position_ids, attention_mask=attention_mask,
                             past_key_values=cache, use_cache=True, logits_to_keep=1 if last_only else 0)
        finally:
            if override:
                self.config._attn_implementation = attention
            for hook in hooks:
                hook.remove()
        features = torch.cat([captured[i] for i in feature_layer_ids], dim=-1) if feature_layer_ids else None
        return out.logits, features

    def check_drafter(self, config: DrafterConfig) -> None:
        """Raise if a drafter with `config` cannot run on this target."""
        where = f"drafter vs target {self.source}"
        if config.hidden_size != self.hidden_size:
            raise CompatibilityError(f"{where}: drafter hidden_size {config.hidden_size} != target hidden_size "
                                     f"{self.hidden_size}")
        if config.vocab_size != self.vocab_size:
            raise CompatibilityError(f"{where}: drafter vocab_size {config.vocab_size} != target vocabulary "
                                     f"{self.vocab_size}")
        if not 0 <= config.mask_token_id < self.vocab_size:
            raise CompatibilityError(f"{where}: mask_token_id {config.mask_token_id} is outside the target "
                                     f"embedding ({self.vocab_size} rows)")
        if config.num_target_layers != self.num_layers:
            raise CompatibilityError(f"{where}: drafter was trained for {config.num_target_layers} target layers, "
                                     f"target has {self.num_layers}")
        bad = [i for i in config.target_layer_ids if i >= self.num_layers]
        if bad:
            raise CompatibilityError(f"{where}: target_layer_ids {bad} outside the target's {self.num_layers} layers")


def _capture(store: dict[int, torch.Tensor], index: int):
    def hook(_module, _inputs, output):
        store[index] = output[0] if isinstance(output, tuple) else output
    return hook


def _decoder_layers(model: nn.Module, source: str) -> nn.ModuleList:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ConfigError(f"{source}: {type(model).__name__} has no decoder layers at .model.layers")
    return layers


WEIGHTS = ("auto", "float", "gguf")


def load_target(path: str | Path, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu", pack: bool = True, weights: str = "float",
                blocks_from: str | Path | None = None) -> TargetModel:
    """Load a Hugging Face causal LM from a model directory or a .gguf file (dequantized to `dtype`).

    pack: CPU float32 linear layers are packed for oneDNN (cpu_linear.py). Pass False when the model is
    about to be transformed module by module (ModelOpt quantization replaces nn.Linear by exact type).
    weights: "float" computes with the float weights; "gguf" runs a .gguf target's linear layers at the
    GGUF's own precision (gguf_weights.py; CPU, float32 activations); "auto" is "gguf" for a .gguf file on
    CPU in float32, else "float".
    blocks_from: the .gguf file whose blocks the linear layers run, when `path` is that GGUF's dequantized
    model directory (an engine's target/). The model and its tokenizer then load from the directory: transformers
    parses a GGUF's metadata (its whole vocabulary) once per config, tokenizer and model, which took 20 s of a 25 s
    load for the demo target, against 5 s this way.
    """
    from transformers import AutoModelForCausalLM

    path = Path(path)
    gguf = Path(blocks_from) if blocks_from is not None else path
    if blocks_from is not None and weights != "gguf":
        raise ConfigError(f"blocks_from ({gguf}) goes with weights='gguf', got {weights!r}")
    shipped = _shipped_precision(weights, gguf, dtype, device)
    kwargs: dict = {}
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ConfigError(f"{path}: GGUF file not found")
        directory, kwargs["gguf_file"] = path.parent, path.name
    else:
        if not (path / "config.json").is_file():
            raise ConfigError(f"{path}: not a model directory (no config.json)")
        directory = path
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype, **kwargs).to(device)
    if shipped:
        from dflash_trt.decoding.model.gguf_weights import quantize_like_gguf

        quantize_like_gguf(model, gguf)
    if pack:
        pack_linear_layers(model)  # CPU float32: weights packed once for multi-row (verify) matmuls
    target = TargetModel(model, tokenizer=load_tokenizer(path), source=str(path))
    if shipped:
        target.weights = "gguf"
        target.use_rowwise_attention()
        target.use_lean_forward()  # a Llama target; any other keeps the model's forward
    target.use_bf16_draft_head()
    return target


def _shipped_precision(weights: str, path: Path, dtype: torch.dtype, device) -> bool:
    """Whether load_target runs the GGUF's own precision (see its `weights` argument)."""
    if weights not in WEIGHTS:
        raise ConfigError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    usable = path.suffix == ".gguf" and dtype == torch.float32 and torch.device(device).type == "cpu"
    if weights == "gguf" and not usable:
        raise ConfigError(f"{path}: --weights gguf needs a .gguf target on CPU with --dtype float32; "
                          "use --weights float")
    return weights == "gguf" or (weights == "auto" and usable)


# Files that hold a vocabulary. Without one, transformers 5 still builds a tokenizer for some
# architectures (an empty Qwen2Tokenizer for Qwen3, whose eos would then be token 0).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model", "tiktoken.model")


def has_tokenizer(path: str | Path) -> bool:
    """Whether a model directory (or GGUF file, which embeds its vocabulary) ships a tokenizer."""
    path = Path(path)
    if path.suffix == ".gguf":
        return path.is_file()
    return any((path / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(path: str | Path):
    """The tokenizer shipped with a model directory or GGUF file, or None when it has none:
    then the model takes and gives token ids only."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not has_tokenizer(path):
        return None
    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(str(path))
