"""The experiments' results as the tables and the picture of docs/benchmarks.md (written
between its markers: the analysis around them is written by people)."""

from __future__ import annotations

from pathlib import Path

from bench.contenders import LABELS, SHORT
from bench.experiments import MODES
from bench.harness import ROOT, Result


def report(all_results: list[Result], empty: float) -> str:
    lines = [
        "| records | contender | runs | seconds (min-max) | rows/s (min-max) | "
        "speed of this pipeline (json) relative to it | peak RSS MB |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in sorted({r.size for r in all_results}):
        group = [r for r in all_results if r.size == n]
        ours = min(next(r for r in group if r.name == "pipeline_json").seconds)
        for r in sorted(group, key=lambda r: min(r.seconds)):
            lo, hi = min(r.seconds), max(r.seconds)
            lines.append(
                f"| {n:,} | {LABELS[r.name]} | {len(r.seconds)} | {lo:.1f}-{hi:.1f} | "
                f"{n / hi / 1000:,.1f}k-{n / lo / 1000:,.1f}k | {lo / ours:.2f} | "
                f"{max(r.rss_mb):,.0f} |")
    lines.append("")
    lines.append(f"Empty run (nothing new to read, no Spark), through the CLI: {empty:.2f} s.")
    lines.append("")
    lines.append("Phases of this pipeline's runs (seconds, from the run's `timings`):")
    lines.append("")
    lines.append("| records | sink | plan | spark_start | read_and_stage | publish | total |")
    lines.append("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in all_results:
        if r.name.startswith("pipeline_"):
            for p in r.phases:
                lines.append(f"| {r.size:,} | {r.name.split('_')[1]} | " + " | ".join(
                    f"{p.get(k, 0):.2f}" for k in ("plan", "spark_start", "read_and_stage",
                                                   "publish", "total")) + " |")
    return "\n".join(lines)


def plot(all_results: list[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r.size for r in all_results})
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 3.6), squeeze=False)
    for ax, n in zip(axes[0], sizes, strict=True):
        group = sorted((r for r in all_results if r.size == n), key=lambda r: min(r.seconds))
        labels = [SHORT[r.name] for r in group]
        rates = [n / min(r.seconds) for r in group]
        colors = ["#aa3377" if r.name.startswith("pipeline") else "#4477aa" for r in group]
        ax.barh(labels[::-1], rates[::-1], color=colors[::-1])
        ax.set_xlabel("rows per second, best run (higher is better)")
        ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1000:.0f}k")
        ax.set_title(f"{n:,} JSON records, 4 partitions, 2 cores")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def scaling_report(rows: list[tuple[int, str, Result]]) -> str:
    lines = ["| records | where the executors run | runs | seconds (min-max) | rows/s (best) | "
             "spark_start | read_and_stage | publish | time relative to 1 worker |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n in sorted({r[0] for r in rows}):
        group = [(label, r) for size, label, r in rows if size == n]
        one = min(next(r for label, r in group if label == "1 worker").seconds)
        for label, r in group:
            best = min(r.seconds)
            phase = {k: min(p.get(k, 0) for p in r.phases)
                     for k in ("spark_start", "read_and_stage", "publish")}
            where = ("`local[2]`: driver and executor in one JVM" if label == "local[2]"
                     else f"standalone cluster, {label} of 1 core")
            lines.append(
                f"| {n:,} | {where} | {len(r.seconds)} | {best:.1f}-{max(r.seconds):.1f} | "
                f"{n / best / 1000:,.1f}k | {phase['spark_start']:.2f} | "
                f"{phase['read_and_stage']:.2f} | {phase['publish']:.2f} | "
                f"{best / one:.2f} |")
    return "\n".join(lines)


def modes_report(rows: list[tuple[Result, list]]) -> str:
    lines = ["| records | sink mode | runs | seconds (min-max) | rows/s (best) | time "
             "relative to append | spark_start | read_and_stage | publish | publish "
             "beyond append's |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n in sorted({r.size for r, _ in rows}):
        group = [r for r, _ in rows if r.size == n]
        base = next(r for r in group if r.name == "append")
        base_s = min(base.seconds)
        base_pub = max(min(p.get("publish", 0) for p in base.phases), 0.001)
        for r in group:
            best = min(r.seconds)
            phase = {k: min(p.get(k, 0) for p in r.phases)
                     for k in ("spark_start", "read_and_stage", "publish")}
            lines.append(
                f"| {n:,} | {MODES[r.name][0]} | {len(r.seconds)} | "
                f"{best:.1f}-{max(r.seconds):.1f} | {n / best / 1000:,.1f}k | "
                f"{best / base_s:.2f} | {phase['spark_start']:.2f} | "
                f"{phase['read_and_stage']:.2f} | {phase['publish']:.2f} | "
                f"+{phase['publish'] - base_pub:.2f} s ({phase['publish'] / base_pub:.0f}x) |")
    return "\n".join(lines)


def write_between(markers: tuple[str, str], text: str) -> None:
    """Replace what docs/benchmarks.md holds between two markers; the analysis around them
    is written by people."""
    docs = ROOT / "docs" / "benchmarks.md"
    page = docs.read_text()
    start, end = markers
    head, rest = page.split(start, 1)
    tail = rest.split(end, 1)[1]
    docs.write_text(f"{head}{start}\n{text}\n{end}{tail}")


def plot_rates(results: list[Result], short: dict[str, str], title: str, path: Path) -> None:
    """A scenario's picture: rows/s of each contender's best run, one panel per size, in
    the order given; this pipeline's bars in its colour. ``title`` is formatted with n."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r.size for r in results})
    fig, axes = plt.subplots(1, len(sizes), figsize=(6.5 * len(sizes), 3.2), squeeze=False)
    for ax, n in zip(axes[0], sizes, strict=True):
        group = [r for r in results if r.size == n]
        ax.barh([short[r.name] for r in group][::-1],
                [n / min(r.seconds) for r in group][::-1],
                color=["#aa3377" if r.name.startswith("pipeline") else "#4477aa"
                       for r in group][::-1])
        ax.set_xlabel("rows per second, best run (higher is better)")
        ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1000:g}k")
        ax.set_title(title.format(n=n))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
