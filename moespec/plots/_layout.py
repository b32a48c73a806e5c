"""Layout shared by the figure functions: a caption under the axes that defines the symbols a
figure uses, and a legend placed outside the data."""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt


def add_caption(fig: plt.Figure, text: str, width: int = 170) -> None:
    """Write ``text`` (wrapped) under the axes and make room for it: the definitions a reader needs
    without the paper open."""
    lines = textwrap.wrap(text, width=width)
    fig.text(0.01, 0.005, "\n".join(lines), fontsize=7, color="0.25", va="bottom", ha="left")
    fig.tight_layout(rect=(0, 0.025 + 0.028 * len(lines), 1, 1))


def legend_outside(ax, **kwargs):
    """A legend to the right of ``ax``, outside the data."""
    return ax.legend(fontsize=kwargs.pop("fontsize", 7), loc="upper left", bbox_to_anchor=(1.02, 1),
                     borderaxespad=0, frameon=False, **kwargs)
