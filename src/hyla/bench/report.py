"""Reports of the benchmarks: the ratio table against the issue's targets (markdown) and plots like seed 000's
Fig. 1 (decode time, memory), Fig. 6 (prefill time per token) and Fig. 7 (mixer kernels)."""

from __future__ import annotations

from pathlib import Path

CONTEXT_512K, CONTEXT_1M, CONTEXT_32K = 2**19, 2**20, 2**15
# The targets, fixed in advance (bytes and FLOP floors explain them; see docs/results/speed.md).
TARGETS = {"prefill_speedup": 3.3, "prefill_floor_ratio": 1.6, "decode_floor_ratio": 1.25, "decode_speedup": 3.2}


def _k(count: int) -> str:
    return f"{count // 2**20}M" if count >= 2**20 else f"{count // 1024}K" if count >= 1024 else str(count)


def _row(results: dict, system: str, kind: str, context: int, batch: int = 1) -> dict | None:
    rows = results.get("systems", {}).get(system, {}).get(kind, [])
    return next((r for r in rows if r["context"] == context and r["batch"] == batch), None)


def _verdict(value: float | None, target: float, *, at_least: bool) -> str:
    if value is None:
        return "not measured"
    met = value >= target if at_least else value <= target
    return "met" if met else f"missed by {abs(value / target - 1) * 100:.0f}%"


def ratio_lines(results: dict) -> list[str]:
    lines = ["| quantity | value | target | verdict |", "|---|---|---|---|"]

    def add(label, value, target, at_least, fmt="{:.2f}x"):
        shown = "n/a" if value is None else fmt.format(value)
        wanted = "" if target is None else (">= " if at_least else "<= ") + fmt.format(target)
        verdict = "reported" if target is None else _verdict(value, target, at_least=at_least)
        lines.append(f"| {label} | {shown} | {wanted} | {verdict} |")

    hp = _row(results, "hypenet", "prefill", CONTEXT_512K)
    qp = _row(results, "qwen3-engine", "prefill", CONTEXT_512K)
    add("prefill 512K: Qwen3 shape / HypeNet, same engine", qp and hp and qp["ms"] / hp["ms"],
        TARGETS["prefill_speedup"], True)
    add("prefill 512K: HypeNet time / FLOP floor", hp and hp["ratio_to_floor"], TARGETS["prefill_floor_ratio"], False)
    add("prefill 512K: HypeNet seconds", hp and hp["ms"] / 1e3, None, True, "{:.2f} s")
    hd = _row(results, "hypenet", "decode", CONTEXT_512K)
    qd = _row(results, "qwen3-engine", "decode", CONTEXT_512K)
    add("decode 512K B=1: HypeNet ms/token", hd and hd["ms_per_token"], None, False, "{:.3f} ms")
    add("decode 512K B=1: HypeNet / bytes floor", hd and hd["ratio_to_floor"], TARGETS["decode_floor_ratio"], False)
    add("decode 512K B=1: Qwen3 shape / HypeNet, same engine", qd and hd and qd["ms_per_token"] / hd["ms_per_token"],
        TARGETS["decode_speedup"], True)
    for system, label in (("qwen3-hf-graph", "HF StaticCache + CUDA graph"), ("qwen3-hf-default", "HF default")):
        for context in (CONTEXT_32K, 2**17, CONTEXT_512K):
            other, ours = _row(results, system, "decode", context), _row(results, "hypenet", "decode", context)
            if other and ours:
                add(f"decode {_k(context)} B=1: {label} Qwen3 / HypeNet",
                    other["ms_per_token"] / ours["ms_per_token"], None, True)
    for kind, unit in (("prefill", "s"), ("decode", "ms/token")):
        row = _row(results, "hypenet", kind, CONTEXT_1M)
        value = None if row is None else (row["ms"] / 1e3 if kind == "prefill" else row["ms_per_token"])
        add(f"HypeNet 1M {kind}", value, None, True, "{:.3f} " + unit)
        if row is not None:
            memory = row.get("peak_gib")
            add(f"HypeNet 1M {kind}: peak memory", memory, None, True, "{:.1f} GiB")
    for system in ("hypenet", "qwen3-engine", "qwen3-hf-graph", "qwen3-hf-default"):
        row = _row(results, system, "decode", CONTEXT_32K, batch=32)
        add(f"decode 32K B=32: {system} tokens/s", row and row["tokens_per_s"], None, True, "{:.0f}")
    return lines


def decode_table(results: dict) -> list[str]:
    lines = ["| system | batch | context | ms/token | floor ms | x floor | tokens/s |", "|---|---|---|---|---|---|---|"]
    for system, data in results.get("systems", {}).items():
        for r in sorted(data.get("decode", []), key=lambda r: (r["batch"], r["context"])):
            lines.append(f"| {system} | {r['batch']} | {_k(r['context'])} | {r['ms_per_token']:.3f} | "
                         f"{r['floor_ms']:.3f} | {r['ratio_to_floor']:.2f} | {r['tokens_per_s']:.1f} |")
    return lines


def prefill_table(results: dict) -> list[str]:
    lines = ["| system | context | seconds | us/token | TFLOP/s | x FLOP floor | peak GiB |",
             "|---|---|---|---|---|---|---|"]
    for system, data in results.get("systems", {}).items():
        for r in sorted(data.get("prefill", []), key=lambda r: r["context"]):
            peak = "" if r.get("peak_gib") is None else f"{r['peak_gib']:.1f}"
            lines.append(f"| {system} | {_k(r['context'])} | {r['ms'] / 1e3:.3f} | {r['us_per_token']:.2f} | "
                         f"{r['tflops']:.0f} | {r['ratio_to_floor']:.2f} | {peak} |")
    return lines


def plot_model(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for system, data in results.get("systems", {}).items():
        decode = sorted((r for r in data.get("decode", []) if r["batch"] == 1), key=lambda r: r["context"])
        prefill = sorted(data.get("prefill", []), key=lambda r: r["context"])
        if decode:
            xs = [r["context"] for r in decode]
            axes[0].plot(xs, [r["ms_per_token"] for r in decode], "o-", label=system)
            axes[2].plot(xs, [r["weights_plus_cache_gib"] for r in decode], "o-", label=system)
            if system in ("hypenet", "qwen3-engine"):
                axes[0].plot(xs, [r["floor_ms"] for r in decode], "k:", lw=0.8)
        if prefill:
            axes[1].plot([r["context"] for r in prefill], [r["us_per_token"] for r in prefill], "o-", label=system)
    titles = ("decode, batch 1 (ms/token; dotted: bytes floor)", "prefill (us/token)", "weights + cache (GiB)")
    for axis, title in zip(axes, titles):
        axis.set_title(title)
        if not axis.lines:  # e.g. decode over synthetic caches only: no prefill was timed
            axis.text(0.5, 0.5, "not measured in this run", ha="center", va="center", transform=axis.transAxes)
            axis.set_xticks([])
            axis.set_yticks([])
            continue
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("context (tokens)")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_kernels(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for axis, mode in zip(axes, ("forward", "forward+backward")):
        names = sorted({r["mixer"] for r in results["results"] if r["mode"] == mode})
        for name in names:
            rows = sorted((r for r in results["results"] if r["mode"] == mode and r["mixer"] == name),
                          key=lambda r: r["length"])
            axis.plot([r["length"] for r in rows], [r["median_ms"] for r in rows], "o-", label=name)
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("sequence length")
        axis.set_ylabel("ms")
        axis.set_title(f"{mode}, bf16, H={results['settings']['num_heads']}, D={results['settings']['head_dim']}")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def model_markdown(results: dict, command: str) -> str:
    parts = [f"Command: `{command}`", "", "## Targets", "", *ratio_lines(results), "", "## Prefill (batch 1)", "",
             *prefill_table(results), "", "## Decode", "", *decode_table(results)]
    skipped = [(s, k) for s, d in results.get("systems", {}).items() for k in d.get("skipped", [])]
    if skipped:
        parts += ["", "## Skipped", ""] + [f"- {s}: {k}" for s, k in skipped]
    return "\n".join(parts) + "\n"
