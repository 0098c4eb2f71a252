"""``kl.png``: the distribution of per-question KL of every W8A8 configuration."""

from __future__ import annotations

import sys

import numpy as np

__all__ = ["plot_kl"]


def plot_kl(comp: dict, path) -> bool:
    """kl.png: ECDF of per-question KL per configuration, log x axis."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("pyw8a8: matplotlib missing, kl.png not written", file=sys.stderr)
        return False
    series = [(n, e) for n, e in comp["configs"].items() if e.get("kl_full_values")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, title in ((axes[0], "kl_full_values", "full vocabulary"),
                           (axes[1], "kl_options_values", "answer options")):
        floor = 1e-10
        for name, e in series:
            v = np.sort(np.maximum(np.asarray(e[key], dtype=np.float64), floor))
            y = np.concatenate([[0.0], np.arange(1, v.size + 1) / v.size])
            v = np.concatenate([v[:1], v])
            line, = ax.step(v, y, where="post", label=f"{name} (mean {np.mean(e[key]):.3g})")
            ax.axvline(max(float(np.mean(e[key])), floor), color=line.get_color(), ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("KL(control || target), nats (log scale)")
        ax.set_ylabel("fraction of questions (cumulative)")
        ax.set_ylim(0.0, 1.02)
        ax.set_title(f"KL at the answer position: {title}")
        ax.grid(True, which="both", alpha=0.3)
        if series:
            ax.legend(fontsize=8, loc="lower right")
        else:
            ax.text(0.5, 0.5, "no W8A8 configuration", ha="center", transform=ax.transAxes)
    fig.suptitle(f"Gemma 3 270M, {comp['meta']['n']} questions (dotted: means)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
