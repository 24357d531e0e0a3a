"""The load sweep's picture and table (bench/served/load_sweep.py's `load` section, read only).

`draw`: goodput, TTFT p99 and ITL p99 against the offered rate, one line per system
(matplotlib, a dev dependency; without it the section says so). `print_table`: one line
per rate and system, then the goodput ratios.
"""

from __future__ import annotations

import json
from pathlib import Path

SYSTEMS = ("ortserve", "llama_server", "genai_engine")  # the order of the table and the picture


def draw(doc: dict, png: Path) -> dict:
    """Goodput, TTFT p99 and ITL p99 against offered rate, one line per system."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {"skipped": "matplotlib is not installed: `make setup` installs it (a dev dependency)"}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    rates = [r["rate_per_s"] for r in doc["by_rate"]]
    panels = (("goodput_per_s", "goodput (req/s meeting the goal)"),
              ("ttft_p99_ms", "TTFT p99 (ms)"), ("itl_p99_ms", "ITL p99 (ms)"))
    for ax, (key, label) in zip(axes, panels, strict=True):
        for name in SYSTEMS:
            ys = [_figure(r["systems"].get(name), key) for r in doc["by_rate"]]
            if any(y is not None for y in ys):
                ax.plot(rates, [float("nan") if y is None else y for y in ys], marker="o", label=name)
        if key == "goodput_per_s":
            ax.plot(rates, rates, linestyle=":", color="grey", label="offered")
        else:
            ax.set_yscale("log")
            goal = doc["goal"]["ttft_ms" if key.startswith("ttft") else "itl_p99_ms"]
            ax.axhline(goal, linestyle="--", color="grey", label="goal")
        ax.axvline(doc["saturation"]["rate_per_s"], linestyle=":", color="black", linewidth=0.8)
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    scale = f" at {doc['scale']:g}x its lengths" if doc.get("scale", 1) != 1 else ""
    load = (f"; load average {doc['load_average_1m_max']:.1f} at most"
            if "load_average_1m_max" in doc else "")
    fig.suptitle(f"{doc['mix']} mix{scale}, {doc['duration_s_per_rate']:g} s per rate{load}; dotted: "
                 f"ortserve's saturation ({doc['saturation']['rate_per_s']:.2f} req/s)", fontsize=10)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=90)
    plt.close(fig)
    return {"path": str(png)}


def _figure(run: dict | None, key: str):
    if run is None:
        return None
    if key == "goodput_per_s":
        return run["goodput_per_s"]
    return run["ttft_ms" if key.startswith("ttft") else "itl_ms"]["p99"]


def print_table(doc: dict) -> None:
    print(f"{'req/s':>7} {'system':<13} {'goodput':>8} {'tok/s':>7} {'TTFT p50/p99 ms':>17} "
          f"{'ITL p50/p99 ms':>15}  outcomes")
    for row in doc["by_rate"]:
        for name, run in row["systems"].items():
            t, i = run["ttft_ms"], run["itl_ms"]
            fmt = lambda x: "-" if x is None else f"{x:.0f}"  # noqa: E731
            print(f"{row['rate_per_s']:>7.2f} {name:<13} {run['goodput_per_s']:>8.2f} "
                  f"{run['throughput_tokens_per_s']:>7.0f} {fmt(t['p50']) + '/' + fmt(t['p99']):>17} "
                  f"{fmt(i['p50']) + '/' + fmt(i['p99']):>15}  "
                  + " ".join(f"{k}={v}" for k, v in run["outcomes"].items() if v)
                  + (f" (refused with a remedy {run['refused']['with_remedy']})"
                     if run["refused"].get("with_remedy") else ""))
    for row in doc.get("closed_loop", []):
        for name, run in row["systems"].items():
            t = run["ttft_ms"]
            fmt = lambda x: "-" if x is None else f"{x:.0f}"  # noqa: E731
            print(f"{str(row['users']) + ' users':>9} {name:<13} {run['throughput_tokens_per_s']:>7.0f} tok/s "
                  f"TTFT p50/p99 {fmt(t['p50'])}/{fmt(t['p99'])} ms  "
                  + " ".join(f"{k}={v}" for k, v in run["outcomes"].items() if v))
    for key in ("goodput_vs_llama_server", "goodput_vs_genai_engine", "throughput_vs_llama_server",
                "throughput_vs_genai_engine"):
        if key in doc:
            print(f"{key}: {json.dumps(doc[key])}")
