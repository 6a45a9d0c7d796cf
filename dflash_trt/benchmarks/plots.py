"""PNG plots of a summary (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(summary: dict, out: Path) -> list[Path]:
    """sweep.png, acceptance_histogram.png and, when served, serving.png; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [_sweep(summary, out / "sweep.png"), _histogram(summary, out / "acceptance_histogram.png")]
    if summary.get("serving"):
        paths.append(_serving(summary["serving"], out / "serving.png"))
    return paths


def _sweep(summary: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, (tau_ax, speed_ax) = plt.subplots(1, 2, figsize=(10, 4))
    series = {family: data["sweep"] for family, data in summary["per_family"].items()}
    series["all"] = summary["sweep"]
    for name, sweep in series.items():
        sizes = [int(size) for size in sweep]
        style = {"linewidth": 2.5, "color": "black"} if name == "all" else {"alpha": 0.8}
        tau_ax.plot(sizes, [f["tau"] for f in sweep.values()], marker="o", label=name, **style)
        speed_ax.plot(sizes, [f["speedup"] for f in sweep.values()], marker="o", label=name, **style)
    tau_ax.set(title="acceptance length tau", xlabel="block size", ylabel="tau (tokens per verify step)")
    speed_ax.axhline(1.0, color="grey", linestyle=":")
    speed_ax.set(title="decode-phase speedup vs block size 1", xlabel="block size", ylabel="speedup (x)")
    for ax in (tau_ax, speed_ax):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    speed_ax.legend(fontsize=8)
    fig.suptitle(f"{summary['engine']}: in-process sweep")
    return _save(fig, path)


def _histogram(summary: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    families = list(summary["per_family"])
    width = 0.8 / max(1, len(families))
    for index, family in enumerate(families):
        counts = summary["per_family"][family]["acceptance_histogram"]
        total = sum(counts.values()) or 1
        lengths = [int(length) for length in counts]
        ax.bar([length + (index - (len(families) - 1) / 2) * width for length in lengths],
               [count / total for count in counts.values()], width=width, label=family)
    ax.set(title=f"acceptance length per verify step (block size {summary['block_size']})",
           xlabel="acceptance length (accepted drafts + 1)", ylabel="share of verify steps")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def _serving(serving: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for mode in ("dflash", "plain"):
        levels = serving[mode]
        x = [int(level) for level in levels]
        axes[0].plot(x, [r["output_tokens_per_s"] for r in levels.values()], marker="o", label=mode)
        axes[1].plot(x, [_value(r["ttft_ms"]["p50"]) for r in levels.values()], marker="o", label=f"{mode} p50")
        axes[2].plot(x, [_value(r["itl_ms"]["p50"]) for r in levels.values()], marker="o", label=f"{mode} p50")
        axes[2].plot(x, [_value(r["itl_ms"]["p99"]) for r in levels.values()], marker="x", linestyle="--",
                     label=f"{mode} p99")
    axes[0].set(title="output tokens/s", ylabel="tokens/s")
    axes[1].set(title="time to first token", ylabel="ms")
    axes[2].set(title="inter-token latency", ylabel="ms")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Triton ensemble, gRPC streaming: DFlash vs plain decoding")
    return _save(fig, path)


def _value(value):
    return float("nan") if value is None else value


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    fig.clf()
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
