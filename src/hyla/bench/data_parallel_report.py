"""The markdown summary and the plot of `hyla bench data-parallel` (hyla.bench.data_parallel)."""

from __future__ import annotations

from pathlib import Path


def _k(value: float) -> str:
    return f"{value / 1e3:,.1f}K"


def _cases(results: dict) -> list[tuple[str, int, int]]:
    return list(dict.fromkeys((row["stage"], row["batch_per_gpu"], row["seq_len"])
                              for row in results["measurements"]))


def scaling_table(results: dict, case: tuple[str, int, int]) -> list[str]:
    lines = ["| GPUs | mode | tokens/s | per GPU | vs 1 GPU | of ideal | s/step | first step s | peak GiB | "
             "micro-batch | loss first -> last |", "|" + "---|" * 11]
    for row in results["measurements"]:
        if (row["stage"], row["batch_per_gpu"], row["seq_len"]) != case:
            continue
        if "error" in row:
            lines.append(f"| {row['world_size']} | {row['mode']} | {row['error']} |" + " |" * 8)
            continue
        speedup = f"{row['speedup']:.2f}x" if "speedup" in row else "-"
        ideal = f"{100 * row['scaling_efficiency']:.0f}%" if "scaling_efficiency" in row else "-"
        peak = f"{row['peak_gib']:.1f}" if row.get("peak_gib") is not None else "-"
        lines.append(f"| {row['world_size']} | {row['mode']} | {_k(row['tok_per_s'])} | "
                     f"{_k(row['tok_per_s_per_gpu'])} | {speedup} | {ideal} | {row['median_step_s']:.3f} | "
                     f"{row['first_step_s']:.1f} | {peak} | {row['micro_batch_rows_used'] or row['batch_per_gpu']} | "
                     f"{row['losses'][0]:.4f} -> {row['losses'][-1]:.4f} |")
    return lines


def loss_curve_lines(results: dict) -> list[str]:
    lines = ["", "Loss curves (every step, warm-up included; a world of n GPUs trains on n x the rows of one):", "",
             "| case | GPUs | mode | losses |", "|---|---|---|---|"]
    for row in results["measurements"]:
        if "losses" in row:
            lines.append(f"| {row['stage']} {row['batch_per_gpu']}x{row['seq_len']} | {row['world_size']} | "
                         f"{row['mode']} | {' '.join(f'{loss:.4f}' for loss in row['losses'])} |")
    return lines


def parallel_markdown(results: dict, command: str) -> str:
    env = results.get("environment", {})
    lines = [f"# hyla bench data-parallel: {results['teacher']['spec']} on {results['processes']} x "
             f"{env.get('device', '?')}", "", f"`{command}`", "",
             "Same batch per GPU at every GPU count (weak scaling); tokens/s over all the GPUs used; "
             "\"of ideal\": the speed-up over one GPU divided by the GPU count."]
    if results.get("worlds_skipped"):
        count = results["processes"]
        lines += ["", f"Not measured (more GPUs than the run's {count} process{'es' if count > 1 else ''}): "
                      f"{', '.join(str(n) for n in results['worlds_skipped'])}."]
    for case in _cases(results):
        stage, batch, seq_len = case
        label = f"{stage} {batch}x{seq_len}"
        auto = results.get("auto", {}).get(label)
        lines += ["", f"## {label} per GPU", ""]
        if auto:
            lines += [f"`data_parallel=auto` would choose: {auto['mode']} ({auto['reason']}).", ""]
        lines += scaling_table(results, case)
    lines += loss_curve_lines(results)
    return "\n".join(lines + [""])


def plot_parallel(results: dict, path: Path) -> None:
    """Speed-up over one GPU against the GPU count, one panel per case, one line per mode, the ideal dashed."""
    from hyla.outputs import new_figure, save_figure

    cases = _cases(results)
    measured = [row for row in results["measurements"] if "speedup" in row]
    if not measured:
        return
    figure, axes = new_figure(4.0 * len(cases), 3.5, ncols=len(cases))
    axes = list(axes) if len(cases) > 1 else [axes]
    worlds = sorted({row["world_size"] for row in measured})
    for axis, case in zip(axes, cases):
        rows = [row for row in measured if (row["stage"], row["batch_per_gpu"], row["seq_len"]) == case]
        for index, mode in enumerate(dict.fromkeys(row["mode"] for row in rows if row["world_size"] > 1)):
            points = sorted((row["world_size"], row["speedup"]) for row in rows
                            if row["mode"] == mode or row["world_size"] == 1)
            axis.plot(*zip(*points), marker="o", color=f"C{index}", label=mode)
        axis.plot(worlds, worlds, linestyle="--", color="gray", label="ideal")
        axis.set_xticks(worlds)
        axis.set_xlabel("GPUs")
        axis.set_title(f"{case[0]} {case[1]}x{case[2]} per GPU", fontsize=9)
    axes[0].set_ylabel("speed-up over one GPU")
    axes[0].legend(fontsize=8)
    save_figure(figure, path)
