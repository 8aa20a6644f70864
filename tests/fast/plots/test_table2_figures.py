"""Table 2's learning curves: every plotted point inside its panel.

Child et al., 2019, Table 2 (bits per byte / per dim of dense, fixed and strided). The
curves' panel once set its top by the lowest first evaluation, so a pattern whose first
evaluation stood higher entered from above the axes and its first interval was not drawn.
"""

from __future__ import annotations

from fast.plots import style
from fast.plots import table2 as plot_table2


def _run(vals):
    return {"evals": [{"step": 80 * (i + 1), "val": v} for i, v in enumerate(vals)]}


def test_every_mean_and_band_of_the_curves_lies_inside_its_panel(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plot_table2.style, "save",
                        lambda fig, path, **kw: figures.append(fig) or path)
    # the first evaluations differ a lot (dense 6.4, strided 6.2); later ones are close
    runs = {f"{m}/{p}": {"0": _run([first, 5.2, 4.9]), "1": _run([first + 0.05, 5.3, 4.8])}
            for m in ("text", "image")
            for p, first in (("full", 6.4), ("fixed", 6.35), ("strided", 6.2))}
    plot_table2.plot_curves({"runs": runs}, tmp_path / "curves.png")
    for ax in figures[0].axes:
        low, high = ax.get_ylim()
        ys = [y for line in ax.get_lines() for y in line.get_ydata()]
        ys += [y for band in ax.collections for path in band.get_paths()
               for y in path.vertices[:, 1]]
        assert ys and low <= min(ys) and max(ys) <= high, (ax.get_title(), low, high)
    style.plt.close(figures[0])
