"""NVIDIA's recipe settings for gpt-oss-120b on TensorRT-LLM, as the `profile` of a preset.

A preset's `profile` (none, latency, throughput) adds these LLM-API options to the trtllm artifact. Each
value names the NVIDIA/TensorRT-LLM file it comes from:
- CURATED_*: examples/configs/curated/gpt-oss-120b-{latency,throughput}.yaml, the files NVIDIA's gpt-oss
  deployment guide (docs/source/deployment-guide/deployment-guide-for-gpt-oss-on-trtllm.md) points at.
- DATABASE_*: examples/configs/database/openai/gpt-oss-120b/<GPU>/1k1k_tp8_conc<N>.yaml, NVIDIA's
  benchmarked per-concurrency configs (conc16 for latency, conc1024 for throughput).
The recipes' parallelism, batch sizes and MoE backend are not copied: the preset and moe.py own those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CURATED_LATENCY = "examples/configs/curated/gpt-oss-120b-latency.yaml"
CURATED_THROUGHPUT = "examples/configs/curated/gpt-oss-120b-throughput.yaml"
DATABASE_LATENCY = "examples/configs/database/openai/gpt-oss-120b/B200/1k1k_tp8_conc16.yaml"
DATABASE_THROUGHPUT = "examples/configs/database/openai/gpt-oss-120b/B200/1k1k_tp8_conc1024.yaml"


@dataclass(frozen=True)
class Setting:
    """One LLM-API option: its path in the options (dotted), value, and the NVIDIA file it comes from."""

    path: str
    value: Any
    source: str


# stream_interval: 20 (NVIDIA's throughput-benchmark knob) makes TensorRT-LLM return a streamed request's
# tokens every 20 iterations: with DFlash, chunks of up to 20 x block_size tokens (~200 for gpt-oss-120b), so
# a Triton or OpenAI stream stalls and then bursts. It is kept out of the latency profile, the one for
# interactive streaming; only the throughput profile (offline / batch traffic) carries it.
# KV-cache block reuse is not a recipe setting: the preset's kv_block_reuse owns it (presets.py).
RECIPES: dict[str, tuple[Setting, ...]] = {
    "none": (),
    "latency": (
        Setting("max_num_tokens", 16384, CURATED_LATENCY),
        # Detokenizing processes of trtllm-serve's OpenAI server; the dflash model detokenizes in its
        # postprocessing model, so under Triton they only matter for trtllm-serve on the same options.
        Setting("num_postprocess_workers", 4, CURATED_LATENCY),
        # Programmatic dependent launch and no NCCL graph buffer registration, as NVIDIA writes them
        # (integers); env_overrides is TensorRT-LLM's own way to set them from the options.
        Setting("env_overrides.TRTLLM_ENABLE_PDL", 1, DATABASE_LATENCY),
        Setting("env_overrides.NCCL_GRAPH_REGISTER", 0, DATABASE_LATENCY),
    ),
    "throughput": (
        Setting("max_num_tokens", 16384, CURATED_THROUGHPUT),
        Setting("stream_interval", 20, CURATED_THROUGHPUT),  # not for interactive streaming (see above)
        Setting("num_postprocess_workers", 4, CURATED_THROUGHPUT),
        Setting("env_overrides.TRTLLM_ENABLE_PDL", 1, DATABASE_THROUGHPUT),
        Setting("env_overrides.NCCL_GRAPH_REGISTER", 0, DATABASE_THROUGHPUT),
    ),
}
# Profiles whose options may serve interactive streams: they must not batch responses (stream_interval).
STREAMING_PROFILES = ("none", "latency")
PROFILES = tuple(RECIPES)


def apply_profile(options: dict[str, Any], profile: str) -> dict[str, Any]:
    """`options` with the profile's settings merged in (nested sections created as needed)."""
    if profile not in RECIPES:
        raise ValueError(f"unknown profile {profile!r} (known: {', '.join(PROFILES)})")
    for setting in RECIPES[profile]:
        *sections, key = setting.path.split(".")
        node = options
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = setting.value
    return options


def profile_sources(profile: str) -> list[str]:
    """'path = value  (source)' lines for the options file's header."""
    return [f"{s.path} = {s.value!r}  ({s.source})" for s in RECIPES[profile]]
