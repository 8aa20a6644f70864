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


def test_the_timing_figure_draws_the_paper_the_cpu_and_the_gpu_at_the_papers_lengths(
        tmp_path, monkeypatch):
    """One panel per modality, each with the paper's ratios, the CPU's at the paper's
    lengths and the GPU's; the Table 2 runs' own short steps are not drawn (the figure
    once drew them in a left panel that the notebook's prose did not introduce, and no GPU)."""
    figures = []
    monkeypatch.setattr(plot_table2.style, "save",
                        lambda fig, path, **kw: figures.append(fig) or path)
    paper = {"text": {"dataset": "Enwik8 (bits per byte)", "n": 12288,
                      "full": (1.0, 1.31), "fixed": (0.99, 0.55), "strided": (1.13, 0.35)},
             "image": {"dataset": "CIFAR-10 (bits per dim)", "n": 3072,
                       "full": (2.82, 0.54), "fixed": (2.85, 0.47), "strided": (2.8, 0.38)}}
    cpu = {"text": (8.0, 2.0, 1.0), "image": (1.0, 0.6, 0.3)}           # full, fixed, strided
    gpu_s = {"enwik8": (0.2, 0.15, 0.1), "cifar10": (0.1, 0.13, 0.11)}
    patterns = ("full", "fixed", "strided")
    data = {"paper": paper,
            "summary": {f"{m}/{p}": {"time_per_iter": 0.5, "time_per_iter_std": 0.01}
                        for m in ("text", "image") for p in (patterns[0],)}
            | {f"{m}/{p}": {"time_per_iter": 0.45, "time_per_iter_std": 0.01}   # 0.9x: not drawn
               for m in ("text", "image") for p in patterns[1:]},
            "timing": [{"modality": m, "pattern": p, "n": paper[m]["n"], "time_per_iter": t}
                       for m, times in cpu.items() for p, t in zip(patterns, times)]}
    gpu = {"machine": {"gpu": "Some GPU"},
           "rows": [{"shape": shape, "pattern": p, "s_per_iter": t}
                    for shape, times in gpu_s.items() for p, t in zip(patterns, times)]
           + [{"shape": "enwik8", "pattern": "none", "s_per_iter": 0.05}]}   # a floor row
    plot_table2.plot_timing(data, tmp_path / "timing.png", gpu)
    axes = [ax for ax in figures[0].axes if ax.patches]
    assert len(axes) == 2
    for ax, modality, shape in zip(axes, ("text", "image"), ("enwik8", "cifar10")):
        assert modality in ax.get_title() and f"{paper[modality]['n']:,}" in ax.get_title()
        heights = [round(bar.get_height(), 4) for bar in ax.patches]
        want = [round(t / times[0], 4)
                for times in ([paper[modality][p][1] for p in patterns], cpu[modality],
                              gpu_s[shape]) for t in times]
        assert heights == want, (modality, heights, want)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["paper, its GPUs", "this CPU",
                                                                "Some GPU"]
    style.plt.close(figures[0])


def test_the_timing_figure_leaves_out_a_gpu_it_is_not_given(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plot_table2.style, "save",
                        lambda fig, path, **kw: figures.append(fig) or path)
    paper = {m: {"dataset": f"{m} set", "n": 64, "full": (1, 1.0), "fixed": (1, 0.5),
                 "strided": (1, 0.25)} for m in ("text", "image")}
    data = {"paper": paper, "timing": [{"modality": m, "pattern": p, "n": 64, "time_per_iter": 1.0}
                                       for m in paper for p in ("full", "fixed", "strided")]}
    plot_table2.plot_timing(data, tmp_path / "timing.png")
    for ax in figures[0].axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == ["paper, its GPUs", "this CPU"]
    style.plt.close(figures[0])
