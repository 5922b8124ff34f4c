"""The markdown summary and the plot of `hyla bench train` (hyla.bench.train)."""

from __future__ import annotations

from pathlib import Path

from hyla.bench.train import DISTILL_MEMORY_TARGET_GIB, TARGETS


def _k(value: float) -> str:
    return f"{value / 1e3:,.1f}K"


def _eager_rate(results: dict, case: dict) -> float | None:
    for other in results["cases"]:
        if (other["path"] == "eager" and other["stage"] == case["stage"] and other["batch"] == case["batch"]
                and other["seq_len"] == case["seq_len"] and "tok_per_s" in other):
            return other["tok_per_s"]
    return None


def case_table(results: dict) -> list[str]:
    lines = ["| stage | shape | path | tokens/s | vs eager | s/step | first step s | GFLOP/token | TFLOP/s | MFU | "
             "peak GiB | micro-batch |", "|" + "---|" * 12]
    for case in results["cases"]:
        shape = f"{case['batch']}x{case['seq_len']}"
        if "error" in case:
            lines.append(f"| {case['stage']} | {shape} | {case['path']} | {case['error']} |" + " |" * 8)
            continue
        eager = _eager_rate(results, case)
        ratio = f"{case['tok_per_s'] / eager:.2f}x" if eager and case["path"] != "eager" else ""
        mfu = f"{100 * case['mfu']:.1f}%" if case.get("mfu") is not None else "-"
        peak = f"{case['peak_gib']:.1f}" if case.get("peak_gib") is not None else "-"
        lines.append(f"| {case['stage']} | {shape} | {case['path']} | {_k(case['tok_per_s'])} | {ratio} | "
                     f"{case['median_step_s']:.3f} | {case['first_step_s']:.1f} | "
                     f"{case['flops_per_token']['total'] / 1e9:.3f} | {case['tflop_per_s']:.3g} | {mfu} | {peak} | "
                     f"{case['micro_batch_rows_used'] or case['batch']} |")
    return lines


def target_lines(results: dict) -> list[str]:
    """The fast path's targets at the SmolLM2-135M shape on one H200, met or missed, from this run's numbers (none
    for other shapes or devices)."""
    lines = []
    if not (results["teacher"]["spec"].startswith("smollm2") and "H200" in results.get("environment", {}).get(
            "device", "")):
        return lines
    for case in results["cases"]:
        if case["path"] == "eager" or "tok_per_s" not in case or case["stage"] not in TARGETS:
            continue
        target = TARGETS[case["stage"]]
        verdict = "met" if case["tok_per_s"] >= target else "missed"
        path = "" if case["path"] == "fast" else f" ({case['path']})"
        lines.append(f"- {case['stage']} at {case['batch']}x{case['seq_len']}{path}: {_k(case['tok_per_s'])} "
                     f"tokens/s (target {_k(target)}: {verdict})")
        if case["stage"] == "distill" and case["batch"] * case["seq_len"] == 65536 and case.get("peak_gib"):
            verdict = "met" if case["peak_gib"] <= DISTILL_MEMORY_TARGET_GIB else "missed"
            lines.append(f"- distill with 64K tokens a step: peak {case['peak_gib']:.1f} GiB (target "
                         f"<= {DISTILL_MEMORY_TARGET_GIB:.0f} GiB: {verdict})")
    return lines


# A step whose kernels fill less of its time than this is bound by the host (launches, Python), not by the GPU.
GPU_BOUND_SHARE = 0.8


def bound_by(kernel_ms: float | None, step_s: float | None) -> str:
    """What sets a step's pace, from its kernels' device time against the timed step's median: "" when unknown."""
    if not kernel_ms or not step_s:
        return ""
    share = kernel_ms / (step_s * 1e3)
    where = "the GPU" if share >= GPU_BOUND_SHARE else "the host (launches, Python)"
    return (f" Its kernels fill {kernel_ms:.0f} ms of the timed step's {step_s * 1e3:.0f} ms ({share:.0%}): bound by "
            f"{where}.")


def _compiled_text(case: dict) -> str:
    compiled = case.get("compiled")
    if not compiled or not compiled["graphs"]:
        return ""
    return f" from {compiled['graphs']} compiled graphs ({compiled['graph_breaks']} graph breaks)"


def profile_lines(results: dict, top: int = 12) -> list[str]:
    lines = []
    for case in results["cases"]:
        profile = case.get("profile")
        if not profile:
            continue
        kernel_ms = profile["kernel_ms"]
        lines += ["", f"**{case['stage']} {case['batch']}x{case['seq_len']} ({case['path']}), one profiled step**: "
                  f"wall {profile['wall_ms']:.1f} ms, kernels " + (f"{kernel_ms:.1f} ms" if kernel_ms else "-")
                  + f", {profile['kernels']:.0f} kernels" + _compiled_text(case) + "; by kind: "
                  + ", ".join(f"{kind} {ms:.1f} ms" for kind, ms in profile["by_kind_ms"].items()) + "."
                  + bound_by(kernel_ms, case.get("median_step_s")), "",
                  "| ms | calls | kernel |", "|---|---|---|"]
        lines += [f"| {row['us_per_step'] / 1e3:.2f} | {row['calls_per_step']:.0f} | `{row['name'][:100]}` |"
                  for row in profile["top"][:top]]
    return lines


def loss_lines(results: dict) -> list[str]:
    if not results.get("losses"):
        return []
    lines = ["", "LM-head losses alone (forward + backward, bf16 autocast):", "",
             "| loss | implementation | rows | ms | peak GiB | value vs logits |", "|---|---|---|---|---|---|"]
    for row in results["losses"]:
        if "error" in row:
            lines.append(f"| {row['loss']} | {row['implementation']} | | {row['error']} | | |")
            continue
        peak = f"{row['peak_gib']:.1f}" if row.get("peak_gib") is not None else "-"
        lines.append(f"| {row['loss']} | {row['implementation']} | {row['rows']} | {row['median_ms']:.2f} | {peak} | "
                     f"{row['relative_difference']:.1e} |")
    return lines


def train_markdown(results: dict, command: str) -> str:
    env = results.get("environment", {})
    lines = [f"# hyla bench train: {results['teacher']['spec']} on {env.get('device', '?')}", "",
             f"`{command}`", "", *case_table(results), "", *target_lines(results), *profile_lines(results),
             *loss_lines(results), ""]
    return "\n".join(lines)


def plot_train(results: dict, path: Path) -> None:
    from hyla.outputs import new_figure, save_figure

    measured = {(f"{c['stage']}\n{c['batch']}x{c['seq_len']}", c["path"]): c for c in results["cases"]
                if "tok_per_s" in c}
    if not measured:
        return
    labels = list(dict.fromkeys(label for label, _ in measured))
    paths = list(dict.fromkeys(name for _, name in measured))
    width = 0.8 / len(paths)
    figure, axis = new_figure(8.0, 4.0)
    for offset, name in enumerate(paths):
        for index, label in enumerate(labels):
            case = measured.get((label, name))
            if case is None:
                continue
            bar = axis.bar(index + offset * width, case["tok_per_s"] / 1e3, width, color=f"C{offset}",
                           label=name if index == 0 else None)[0]
            if case.get("peak_gib") is not None:
                axis.annotate(f"{case['peak_gib']:.0f} GiB", (bar.get_x() + width / 2, bar.get_height()),
                              ha="center", va="bottom", fontsize=7)
    axis.set_xticks([i + width * (len(paths) - 1) / 2 for i in range(len(labels))], labels)
    axis.set_ylabel("thousand tokens/s")
    axis.set_title("training step throughput (peak memory above each bar)")
    axis.legend()
    save_figure(figure, path)
