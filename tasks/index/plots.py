"""Figures users look at: cluster sparsity and its change rate per layer (HiRAG Fig. 4)."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from schemas.tables import LayerRow


def layers_png(rows: list[LayerRow], epsilon: float) -> bytes | None:
    """CS_i and the change rate per clustering, the stopping clustering marked, as PNG bytes; None when nothing to
    plot. Drawn on a ``Figure`` of its own (no pyplot state), so a thread may draw it while the run validates."""
    pts = [r for r in rows if r["cluster_sparsity"] is not None]
    if not pts:
        return None
    from matplotlib.figure import Figure

    layers = [r["layer"] for r in pts]
    fig = Figure(figsize=(6, 3.6), dpi=120)
    ax = fig.subplots()
    sparsity = cast("list[float]", [r["cluster_sparsity"] for r in pts])  # pts: the rows where it is not None
    ax.plot(layers, sparsity, "o-", color="tab:blue", label="cluster sparsity CS$_i$")
    ax.set_xlabel("layer i (clustering of layer i-1)")
    ax.set_ylabel("cluster sparsity", color="tab:blue")
    ax.set_xticks(layers)
    ax2 = ax.twinx()
    rates = [(r["layer"], r["change_rate"]) for r in pts if r["change_rate"] is not None]
    if rates:
        ax2.plot([l for l, _ in rates], [c for _, c in rates], "s--", color="tab:pink", label="change rate")
    ax2.axhline(epsilon, color="grey", lw=0.8, ls=":", label=f"ε = {epsilon:g}")
    ax2.set_ylabel("change rate", color="tab:pink")
    for r in pts:
        if r["stopped"]:
            ax.annotate(
                "stop (not built)",
                (r["layer"], r["cluster_sparsity"]),
                textcoords="offset points",
                xytext=(-40, -18),
                fontsize=8,
            )
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="lower right")
    ax.set_title("HiIndex layers: cluster sparsity and change rate")
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()
