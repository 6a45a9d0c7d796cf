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
        _log2_axis(ax, [int(size) for size in summary["sweep"]])
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
    for mode, color in (("dflash", "tab:blue"), ("plain", "tab:orange")):
        levels = serving[mode]
        x = [int(level) for level in levels]
        axes[0].plot(x, [r["output_tokens_per_s"] for r in levels.values()], marker="o", color=color, label=mode)
        for ax, key in ((axes[1], "ttft_ms"), (axes[2], "itl_ms")):
            ax.plot(x, [_value(r[key]["p50"]) for r in levels.values()], marker="o", color=color, label=f"{mode} p50")
            ax.plot(x, [_value(r[key]["p99"]) for r in levels.values()], marker="x", linestyle="--", color=color,
                    label=f"{mode} p99")
    axes[0].set(title="output tokens/s", ylabel="tokens/s")
    axes[1].set(title="time to first token", ylabel="ms")
    axes[2].set(title="inter-token latency", ylabel="ms")
    for ax in axes:
        _log2_axis(ax, [int(level) for level in serving["dflash"]])
        ax.set_xlabel("concurrency")
        ax.legend(fontsize=8)
    fig.suptitle("Triton ensemble, gRPC streaming: DFlash vs plain decoding")
    return _save(fig, path)


def _log2_axis(ax, ticks: list[int]) -> None:
    """Log-2 x axis labelled with the plain values (2, 4, 8 rather than 2^1, 2^2, 2^3)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(tick) for tick in ticks])
    ax.minorticks_off()
    ax.grid(alpha=0.3)


def _value(value):
    return float("nan") if value is None else value


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    fig.clf()
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
