"""The loss-curve figure of a training log (matplotlib, optional: absent -> a warning, no file)."""

from __future__ import annotations

import warnings


def plot_losses(log: dict, path: str, names: tuple[str, ...] = ("target", "draft"),
                title: str = "specviz demo models: loss on held-out Python source") -> str | None:
    """Train (thin) and held-out (markers) loss against tokens seen, one colour per model.

    log: a train_log.json dict (see :func:`specviz.train.loop.train_models`). Returns ``path``, or
    None (with a warning) if matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FixedLocator, NullFormatter, ScalarFormatter
    except ImportError:
        warnings.warn("matplotlib is not installed: no loss-curve image written")
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for name, colour in zip(names, ("tab:blue", "tab:orange")):
        key = f"loss_{name}"
        tr = [(r["tokens"] / 1e6, r[key]) for r in log["train"] if key in r]
        ho = [(r["tokens"] / 1e6, r[key]) for r in log["heldout"] if key in r]
        distilled = name == "draft" and "draft" in log and isinstance(log["draft"], dict)
        if tr:
            ax.plot(*zip(*tr), color=colour, lw=0.8, alpha=0.7,
                    label=f"{name} train" + (" (distillation loss)" if distilled else ""))
        if ho:
            ax.plot(*zip(*ho), color=colour, marker="o", ms=3.5, lw=1.6, label=f"{name} held-out (corpus CE)")
    ax.set_xlabel("tokens seen per model (millions)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(FixedLocator([0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10]))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
