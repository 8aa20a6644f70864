"""The generation figure says which sampler ran on how many threads.

Child et al., 2019, sec. 7 (sampling) and sec. 4.3 (a sparse cache's step reads l + t / l keys).
The caches step on one thread, but the re-run sampler is credited with the faster of one and
two threads at each t (``fast.measure.generation.rerun_seconds``). The figure's title once
said "1 thread(s)" for all of them, and its legend named no threads for the re-run sampler.
"""

from __future__ import annotations

from fast.plots import generation as plot_generation


def _model(n: int, rerun_threads: list[int]) -> dict:
    ts = [n // 4, n // 2, n]
    speed = {"t": ts, "tokens_per_s": [100.0, 90.0, 80.0]}
    return {"config": {"pattern": "strided", "stride": 8, "c": None, "n_heads": 2}, "n": n,
            "sparse": {**speed, "total_s": 1.0, "steps": {"numba": n - 1, "torch": 0}},
            "dense": {**speed, "total_s": 4.0, "steps": {"numba": n // 2, "torch": n // 2 - 1}},
            "rerun": {"t": [1, n], "tokens_per_s": [50.0, 5.0], "total_s_estimated": 90.0,
                      "threads": rerun_threads},
            "cache_bytes": {"n": ts, "sparse": [1, 2, 3], "dense": [1, 2, 3]}}


def _draw(tmp_path, monkeypatch, rerun_threads):
    figures = []
    monkeypatch.setattr(plot_generation.style, "save",
                        lambda fig, path, **kw: figures.append(fig) or path)
    data = {"machine": {"cpu": "Some CPU", "torch_threads": 1, "torch": "2.x"},
            "models": {"photos32": _model(64, rerun_threads), "enwik8": _model(128, rerun_threads)}}
    plot_generation.plot_generation(data, tmp_path / "generation.png")
    return figures[0]


def test_the_title_and_legend_say_the_rerun_sampler_had_two_threads_and_the_caches_one(
        tmp_path, monkeypatch):
    fig = _draw(tmp_path, monkeypatch, [1, 2])
    title = fig._suptitle.get_text()
    assert "caches on 1 thread;" in title, title
    assert "re-run sampler on the faster of 1 and 2 threads at each t" in title, title
    assert "thread(s)" not in title, title
    for ax in fig.axes[::2]:                                          # the speed panels
        labels = [line.get_label() for line in ax.get_lines()]
        assert "re-run sampler, best of 1 and 2 threads" in labels, labels
        assert not any("threads" in label for label in labels if "re-run" not in label), labels
    plot_generation.plt.close(fig)


def test_one_thread_for_every_sampler_is_said_once(tmp_path, monkeypatch):
    fig = _draw(tmp_path, monkeypatch, [1])
    title = fig._suptitle.get_text()
    assert "caches on 1 thread; re-run sampler on 1 thread" in title, title
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert "re-run sampler" in labels, labels
    plot_generation.plt.close(fig)
