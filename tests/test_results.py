"""fast.experiments.results (``python -m fast results``) prints the README's tables from the
figure scripts' JSON (figures/data)."""

import json

from fast.commands import results as results_command
from fast.experiments import results
from fast.experiments.table2 import PAPER, summarise


def test_results_from_minimal_json(tmp_path, capsys):
    bench = {"machine": {"cpu": "CPU", "cpu_count": 2, "torch": "2.13.0"},
             "targets": {"float32": {"strided_fwd_speedup_16384": 13.0,
                                     "strided_fb_speedup_16384": 9.0,
                                     "fixed_fwd_speedup_16384": 3.1, "fixed_fb_speedup_16384": 2.9,
                                     "strided_fwd_slope_4096_65536": 1.0,
                                     "strided_fb_slope_4096_65536": 1.1,
                                     "strided_fb_peak_bytes_65536": 1.5e9}}}
    (tmp_path / "bench_cpu.json").write_text(json.dumps(bench))
    assert results_command.main(["--data", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "| 13.0x |" in captured.out and "1.50 GB" in captured.out
    assert "memory.json" in captured.err  # what was not measured is said, not invented


def test_results_from_committed_figures(capsys):
    assert results_command.main([]) == 0
    assert "Table 2" in capsys.readouterr().out


def test_table2_section_states_spread_ordering_and_paper(tmp_path, capsys):
    """Mean ± std over seeds, the ordering beside the paper's, and in how many seeds it holds."""
    bits = {"full": (3.50, 3.52, 3.48), "fixed": (3.40, 3.45, 3.41), "strided": (3.42, 3.43, 3.46)}
    runs = {}
    for m in ("text", "image"):
        for p, values in bits.items():
            runs[f"{m}/{p}"] = {str(s): {"test_bits": b, "val_bits": b, "time_per_iter": 1.0,
                                         "steps": 300, "model_cfg": {"n_ctx": 256}}
                                for s, b in enumerate(values)}
    t2 = {"runs": runs, "summary": summarise(runs), "paper": PAPER, "machine": "CPU",
          "torch": "2.13.0", "text_eval_windows": 512,
          "timing": [{"modality": m, "pattern": p, "n": 3072, "time_per_iter": t}
                     for m in ("text", "image") for p, t in
                     (("full", 2.0), ("fixed", 1.0), ("strided", 0.5))]}
    (tmp_path / "table2.json").write_text(json.dumps(t2))
    assert results_command.main(["--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| dense | 3.500 ± 0.020 | 1.00 |" in out
    assert "fixed < strided < dense (paper: fixed < dense < strided)" in out     # text
    assert "fixed below strided by 0.017 on average, in 2 of 3 seeds" in out
    assert "(the paper's order)" not in out.split("Ordering on images")[0]
    assert "0.50 s (0.25x)" in out and "0.35 s (0.27x)" in out                 # ours and paper's


def test_drift_section_sets_the_move_beside_the_seed_spread():
    """``table2 --drift``: how far the bits moved when only the thread count changed, beside
    the spread over seeds (the yardstick), and nothing is claimed when it was not measured."""
    runs = {"image/full": {"0": {"test_bits": 6.50}, "1": {"test_bits": 6.30},
                           "2": {"test_bits": 6.40}}}
    assert not any("summation order" in line for line in results.drift_section({"runs": runs}))
    lines = results.drift_section({"runs": runs, "drift": {"image/full": {"test_bits": 6.52}}})
    assert "image/full 0.02, seed std 0.1 (bits)" in lines[-1]
