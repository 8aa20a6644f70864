"""fast.experiments.results (``python -m fast results``) prints the README's tables from the
figure scripts' JSON (figures/data)."""

import json

from fast.experiments import results


def test_results_from_minimal_json(tmp_path, capsys):
    bench = {"machine": {"cpu": "CPU", "cpu_count": 2, "torch": "2.13.0"},
             "targets": {"float32": {"strided_fwd_speedup_16384": 13.0,
                                     "strided_fb_speedup_16384": 9.0,
                                     "fixed_fwd_speedup_16384": 3.1, "fixed_fb_speedup_16384": 2.9,
                                     "strided_fwd_slope_4096_65536": 1.0,
                                     "strided_fb_slope_4096_65536": 1.1,
                                     "strided_fb_peak_bytes_65536": 1.5e9}}}
    (tmp_path / "bench_cpu.json").write_text(json.dumps(bench))
    assert results.main(["--data", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "| 13.0x |" in captured.out and "1.50 GB" in captured.out
    assert "memory.json" in captured.err  # what was not measured is said, not invented


def test_results_from_committed_figures(capsys):
    assert results.main([]) == 0
    assert "Table 2" in capsys.readouterr().out
