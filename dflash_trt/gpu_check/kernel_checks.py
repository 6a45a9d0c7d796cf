"""gpu-check sections on the kernel alone: correctness at real drafter shapes, CUDA graphs, time vs SDPA and HBM."""

from __future__ import annotations

import functools
import random

import torch

from dflash_trt.decoding.kernels.attention import BACKEND_ENV, draft_attention
from dflash_trt.decoding.kernels.plugin.fields import AttentionFields, fields_to_list
from dflash_trt.decoding.kernels.plugin.torch_op import draft_attention_inplace
from dflash_trt.decoding.kernels.rope import RotaryEmbedding
from dflash_trt.gpu_check.report import Section, attention_bytes, floor_us, nominal_bandwidth
from dflash_trt.gpu_check.tolerances import cache_error, output_error

GPT_OSS_YARN = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                "beta_fast": 32.0, "beta_slow": 1.0}
# (name, heads, kv_heads, head_dim, theta, rope_scaling): the drafters' attention shapes.
QWEN3_8B = ("qwen3-8b", 32, 8, 128, 1e6, None)
GPT_OSS_120B = ("gpt-oss-120b", 64, 8, 64, 150000.0, GPT_OSS_YARN)
BLOCK = 16
NEW_ROWS = 16  # context rows appended per call (a verify step commits up to a block)


def make_case(shape, batch: int, context: int, seed: int, dtype=torch.bfloat16, device="cuda"):
    """Ragged inputs: sequence 0 holds `context` keys, the others between context/4 and context."""
    _, heads, kv_heads, head_dim, _, _ = shape
    rng = random.Random(seed)
    totals = [context] + [rng.randint(context // 4, context) for _ in range(batch - 1)]
    ctx_lens = [min(rng.randint(1, NEW_ROWS), t) for t in totals]
    cache_lens = [t - c for t, c in zip(totals, ctx_lens)]
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*size):
        return torch.randn(*size, generator=g, device=device).to(dtype)

    capacity = context + 8
    return {"q": randn(batch, BLOCK, heads, head_dim), "k": randn(batch, BLOCK, kv_heads, head_dim),
            "v": randn(batch, BLOCK, kv_heads, head_dim), "ctx_k": randn(batch, NEW_ROWS, kv_heads, head_dim),
            "ctx_v": randn(batch, NEW_ROWS, kv_heads, head_dim),
            "cache_k": randn(batch, kv_heads, capacity, head_dim),
            "cache_v": randn(batch, kv_heads, capacity, head_dim),
            "cache_lens": torch.tensor(cache_lens, device=device), "ctx_lens": torch.tensor(ctx_lens, device=device)}


def fields_of(shape) -> list[float]:
    _, heads, kv_heads, head_dim, theta, scaling = shape
    return fields_to_list(AttentionFields.from_rope(heads, kv_heads, head_dim, theta, scaling))


def rope_of(shape) -> RotaryEmbedding:
    """The reference's RoPE with the plugin's own table (inverse frequencies, attention factor) where the plugin's
    CPU library can be built here. torch's vectorised pow may put an inverse frequency one fp32 ulp away from the
    plugin's correctly rounded one (tests/plugin/test_plugin_rope_table.py), and at position 32k one ulp moves the
    angle by ~2e-3 rad: more than a bf16 key's last place. With the same table, the kernel's keys are one rounding of
    the reference's fp32 value; without it, tolerances.cache_error is told the positions' angle slack instead."""
    rope = RotaryEmbedding.from_config(shape[3], shape[4], shape[5])
    table = plugin_rope_table(shape)
    if table is not None:
        rope.inv_freq, rope.attention_factor = torch.from_numpy(table[0]), table[1]
    return rope


@functools.lru_cache(maxsize=1)
def plugin_library_loads() -> bool:
    """Whether the plugin's CPU library builds (CMake) and loads here; tried once per process."""
    from dflash_trt.decoding.kernels.plugin.library import load_library

    try:
        load_library()
    except Exception:  # noqa: BLE001 - no cmake or compiler: the reference keeps torch's table, with its slack
        return False
    return True


def plugin_rope_table(shape):
    """(inverse frequencies, attention factor) as the plugin computes them, or None when its library is absent."""
    from dflash_trt.decoding.kernels.plugin.library import rope_table

    if not plugin_library_loads():
        return None
    _, heads, kv_heads, head_dim, theta, scaling = shape
    return rope_table(AttentionFields.from_rope(heads, kv_heads, head_dim, theta, scaling))


def angle_slack(shape, inputs) -> float:
    """Slack of the RoPE'd keys, as a fraction of each rotated pair's norm: a few fp32 ulps for two implementations
    of cos/sin, plus one ulp of the largest angle when the reference cannot share the plugin's table."""
    slack = 8 * 2.0 ** -24
    if plugin_rope_table(shape) is None:
        max_position = int((inputs["cache_lens"] + inputs["ctx_lens"]).max())
        slack += max_position * 2.0 ** -24
    return slack


def clone(inputs):
    return {k: v.clone() for k, v in inputs.items()}


def reference(shape, inputs, chunk: int = 4):
    """The PyTorch reference (forced, never the kernel), a few sequences at a time to bound its fp32 memory."""
    import os

    saved = os.environ.get(BACKEND_ENV)
    os.environ[BACKEND_ENV] = "torch"
    try:
        ref = clone(inputs)
        outs = []
        for start in range(0, inputs["q"].shape[0], chunk):
            part = {k: v[start:start + chunk] for k, v in ref.items()}  # views: caches updated in place
            outs.append(draft_attention(**part, rope=rope_of(shape)))
        return torch.cat(outs), ref
    finally:
        if saved is None:
            os.environ.pop(BACKEND_ENV)
        else:
            os.environ[BACKEND_ENV] = saved


def kernel(shape, inputs):
    ours = clone(inputs)
    return draft_attention_inplace(**ours, fields=fields_of(shape)), ours


def compare(shape, inputs, ours, ours_in, ref, ref_in) -> list[str | None]:
    """The output's and both caches' errors against the reference (None where within tolerance)."""
    return [output_error(ours, ref)] + [
        cache_error(n, ours_in[n], ref_in[n], inputs[n], inputs["cache_lens"], inputs["ctx_lens"],
                    pair_slack=angle_slack(shape, inputs)) for n in ("cache_k", "cache_v")]


def correctness(quick: bool) -> Section:
    section = Section("kernel vs PyTorch reference (bf16, ragged, both caches)")
    contexts = (1024, 8192) if quick else (1024, 8192, 32768)
    cases = [(QWEN3_8B, b, c) for c in contexts for b in (1, 8, 32)] + [(GPT_OSS_120B, b, 8192) for b in (1, 8)]
    for i, (shape, batch, context) in enumerate(cases):
        inputs = make_case(shape, batch, context, seed=i)
        ours, ours_in = kernel(shape, inputs)
        ref, ref_in = reference(shape, inputs)
        errors = [e for e in compare(shape, inputs, ours, ours_in, ref, ref_in) if e]
        section.rows.append({"drafter": shape[0], "batch": batch, "context": context,
                             "max_abs_err": float((ours.float() - ref.float()).abs().max()),
                             "ok": not errors, "error": errors[0] if errors else ""})
        del inputs, ours, ours_in, ref, ref_in
        torch.cuda.empty_cache()
    bad = [r for r in section.rows if not r["ok"]]
    if bad:
        section.status, section.message = "fail", f"{len(bad)} of {len(section.rows)} shapes out of tolerance"
    return section


def graphs() -> Section:
    """Capture one call in a CUDA graph, replay it on fresh caches: output and caches equal eager's bit for bit."""
    section = Section("CUDA graph capture and replay")
    inputs = make_case(QWEN3_8B, 8, 8192, seed=99)
    eager, eager_in = kernel(QWEN3_8B, inputs)
    graph_in = clone(inputs)
    kernel(QWEN3_8B, inputs)  # warm-up outside the capture (sets the shared-memory limit once)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    fields = fields_of(QWEN3_8B)
    with torch.cuda.graph(graph):
        out = draft_attention_inplace(**graph_in, fields=fields)
    replays = 3
    for _ in range(replays):
        graph_in["cache_k"].copy_(inputs["cache_k"])
        graph_in["cache_v"].copy_(inputs["cache_v"])
        graph.replay()
    torch.cuda.synchronize()
    same = (torch.equal(out, eager) and torch.equal(graph_in["cache_k"], eager_in["cache_k"])
            and torch.equal(graph_in["cache_v"], eager_in["cache_v"]))
    section.rows.append({"shape": "qwen3-8b b8 8k", "replays": replays, "identical_to_eager": same})
    if not same:
        section.status, section.message = "fail", "graph replay differs from the eager call"
    return section


def time_us(fn, iterations: int = 50) -> float:
    """Mean microseconds per call after a warm-up: CUDA events on a GPU, the wall clock without one."""
    for _ in range(3):
        fn()
    if not torch.cuda.is_available():
        import time

        begin = time.perf_counter()
        for _ in range(iterations):
            fn()
        return 1e6 * (time.perf_counter() - begin) / iterations
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        fn()
    stop.record()
    stop.synchronize()
    return 1000.0 * start.elapsed_time(stop) / iterations


def graphed_time_us(fn, calls: int = 20, replays: int = 10) -> float:
    """Mean device microseconds per call: `calls` calls captured in one CUDA graph, replayed, so that the host's
    per-call cost (argument checks, allocation, launches: ~60 us for the op) is not counted. The decoder runs its
    draft steps as graphs, so this is the time a step pays; without CUDA, time_us."""
    if not torch.cuda.is_available():
        return time_us(fn)
    from dflash_trt.decoding.model.graphs.capture import capture_graph

    fn()  # outside the capture: first-call set-up (shared-memory limits, workspace sizes)
    graph, _ = capture_graph(lambda: [fn() for _ in range(calls)], pool=None)
    return time_us(graph.replay, iterations=replays) / calls


def copy_bandwidth_gbs() -> float:
    """Measured device-to-device copy bandwidth (read + write bytes), the practical HBM ceiling."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = time_us(lambda: dst.copy_(src), iterations=20)
    return 2 * src.numel() / (us * 1e3)


def timing(quick: bool) -> Section:
    """Kernel vs SDPA (attention over the same keys, no RoPE or append) vs the HBM floor of the kernel's bytes."""
    section = Section("kernel time vs SDPA vs HBM floor (bf16, Qwen3-8B drafter layer)")
    name = torch.cuda.get_device_name()
    nominal = nominal_bandwidth(name)
    measured = copy_bandwidth_gbs()
    points = [(1, 1024), (1, 8192), (1, 32768), (8, 8192), (32, 8192)] + ([] if quick else [(8, 32768)])
    shape = QWEN3_8B
    for batch, context in points:
        inputs = make_case(shape, batch, context, seed=7)
        inputs["cache_lens"].fill_(context - NEW_ROWS)  # equal lengths so SDPA reads the same keys
        inputs["ctx_lens"].fill_(NEW_ROWS)
        fields = fields_of(shape)
        def ours_call():
            return draft_attention_inplace(**inputs, fields=fields)

        q = inputs["q"].transpose(1, 2)
        keys = torch.cat((inputs["cache_k"][:, :, :context], inputs["k"].transpose(1, 2)), dim=2)
        values = torch.cat((inputs["cache_v"][:, :, :context], inputs["v"].transpose(1, 2)), dim=2)

        def sdpa_call():
            return torch.nn.functional.scaled_dot_product_attention(q, keys, values, enable_gqa=True)

        ours, sdpa = graphed_time_us(ours_call), graphed_time_us(sdpa_call)
        num_bytes = attention_bytes([context] * batch, [NEW_ROWS] * batch, BLOCK, shape[1], shape[2], shape[3], 2)
        row = {"batch": batch, "context": context, "kernel_us": ours, "sdpa_us": sdpa,
               "kernel_eager_us": time_us(ours_call), "sdpa_eager_us": time_us(sdpa_call),
               "floor_us_copy_bw": floor_us(num_bytes, measured), "kernel_GBs": num_bytes / (ours * 1e3)}
        if nominal:
            row["floor_us_nominal"] = floor_us(num_bytes, nominal)
            row["pct_of_nominal_hbm"] = 100.0 * row["floor_us_nominal"] / ours
        row["not_slower_than_sdpa"] = ours <= sdpa
        section.rows.append(row)
        del inputs, keys, values
    section.message = (f"{name}: copy bandwidth {measured:.0f} GB/s, nominal {nominal or 'unknown'} GB/s; times are "
                       "device times of graphed calls (*_eager_us: one call at a time, host included); targets: "
                       ">= 50% of HBM at 8k and 32k batch 1, not slower than SDPA")
    return section
