"""fast.experiments.results (``python -m fast results``) prints the README's tables from the
figure scripts' JSON (figures/data)."""

import json

import pytest

from fast.commands import results as results_command
from fast.experiments import results
from fast.experiments.table2 import PAPER, summarise
from tests.conftest import ROOT


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
    assert "| 13.0x |" in captured.out and "1.40 GiB" in captured.out
    assert "memory.json" in captured.err  # what was not measured is said, not invented


def test_a_small_bench_sweep_leaves_out_its_section_only(tmp_path, capsys):
    """A bench record of a valid sweep without n = 16384 (its targets None) costs its own
    section, said in one line naming the file, what it lacks and how to produce it; every
    other section is printed and the exit status is 1."""
    for name in ("memory.json", "table2.json"):
        (tmp_path / name).write_text((ROOT / "figures" / "data" / name).read_text())
    small = {"machine": {"cpu": "CPU", "cpu_count": 2, "torch": "2.13.0"},
             "config": {"ns": [256, 512], "dtypes": ["float32"]},
             "targets": {"float32": {k: None for k in results.TARGETS}}}
    (tmp_path / "bench_cpu.json").write_text(json.dumps(small))
    assert results_command.main(["--data", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "Recomputation" in out and "Table 2" in out
    said = [line for line in err.splitlines() if "bench_cpu.json" in line]
    print(said)
    assert len(said) == 1 and "n = 256 .. 512" in said[0] and "needs n = 16384" in said[0]
    assert "run python -m fast bench" in said[0] and "delete" not in err


def test_an_interrupted_bench_record_is_said_not_used(tmp_path, capsys):
    """A bench record whose run was interrupted ("complete": false, no targets) is one
    line saying so, exit status 1, never a damaged-file refusal or a silent table."""
    partial = {"machine": {"cpu": "CPU", "cpu_count": 2, "torch": "2.13.0"},
               "config": {"ns": [1024], "dtypes": ["float32"]}, "complete": False,
               "results": []}
    (tmp_path / "bench_cpu.json").write_text(json.dumps(partial))
    assert results_command.main(["--data", str(tmp_path)]) == 1
    said = [line for line in capsys.readouterr().err.splitlines() if "bench_cpu.json" in line]
    assert len(said) == 1 and "incomplete" in said[0] and "interrupted" in said[0]


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


# Damaged caches: (file, content, words of the one line). Truncated, empty, not UTF-8,
# another program's JSON, and files whose keys a reader needs are missing or wrongly typed.
DAMAGED = [
    ("table2.json", b'{"summary": {"text/full"', "not valid JSON"),
    ("table2.json", b"", "(empty)"),
    ("memory.json", b"\xff\xfe{}", "not UTF-8 text"),
    ("bench_cpu.json", b"[1, 2]", "a JSON list, not an object"),
    ("table2.json", b'{"runs": {}}', "has no 'summary'"),
    ("bench_cpu.json", json.dumps({"machine": {"cpu": "x", "cpu_count": "two", "torch": "2"},
                                   "targets": {"float32": {}}}).encode(),
     "['machine']['cpu_count'] is 'two'; expected an integer"),
    ("memory_big.json", json.dumps({"big": {}}).encode(), "['big'] has no"),
    ("learned_attention.json", json.dumps({"models": {"full": {"window": 3, "layers": [
        {"layer": 0}]}}, "train": {}, "images": "x"}).encode(), "['models']['full']['layers'][0]"),
    ("make_figures.json", json.dumps({"steps": {"bench": {"seconds": "long"}}}).encode(),
     "['steps']['bench']['seconds'] is 'long'"),
    ("gpu_iteration_time.json", json.dumps({"machine": {"gpu": "G", "torch": "2"},
                                            "config": {"batch": 8, "warm": 1, "steps": 2},
                                            "rows": [{"shape": "x"}]}).encode(),
     "['rows'][0] has no"),
    ("gpu_variants_h200.json", b"{}", "has no 'provenance'"),
]


@pytest.mark.parametrize("name, content, says", DAMAGED,
                         ids=[f"{n}:{s[:24]}" for n, _, s in DAMAGED])
def test_results_refuses_a_damaged_cache_in_one_line(name, content, says, tmp_path, capsys):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(SystemExit) as exit_:
        results_command.main(["--data", str(tmp_path)])
    err = capsys.readouterr().err
    print(err)
    assert exit_.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"python -m fast results: {tmp_path / name}") and says in err


def test_results_refuses_a_table2_whose_timing_lacks_rows(tmp_path, capsys):
    data = json.loads((ROOT / "figures" / "data" / "table2.json").read_text())
    data["timing"] = [r for r in data["timing"] if r["pattern"] != "strided"]
    (tmp_path / "table2.json").write_text(json.dumps(data))
    with pytest.raises(SystemExit) as exit_:
        results_command.main(["--data", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "['timing'] lacks the rows ['image/strided', " \
                                     "'text/strided']" in err


@pytest.mark.parametrize("content, says", [
    (b'{"runs": ["a list"]}', "['runs'] is a list; expected a dict"),
    (b'{"runs": {"text/full": {"0": {"test_bits": "low"}}}}',
     "['runs']['text/full']['0'] has no 'val_bits'"),
    (b'{"quick": "no"}', "says quick='no'; allowed: true or false"),
    (b"\xff\xfe\x00", "not UTF-8 text"),
])
def test_table2_refuses_a_damaged_cache_before_any_run(content, says, tmp_path, capsys,
                                                       monkeypatch):
    from fast.commands import table2 as table2_command
    from fast.experiments import table2

    monkeypatch.setattr(table2, "run_child", lambda *a, **k: pytest.fail("a run started"))
    (tmp_path / "t2.json").write_bytes(content)
    with pytest.raises(SystemExit) as exit_:
        table2_command.main(["--out", str(tmp_path / "t2.json")])
    err = capsys.readouterr().err
    print(err)
    assert exit_.value.code == 2 and err.count("\n") == 1 and says in err


def _depth_summary(layers: int, rowcol_layer: int | None) -> dict:
    """A depth model's summary rows: every head mixed, one head labelled column where asked."""
    labels = [["mixed", "local"] for _ in range(layers)]
    rows = [{"layer": i, "row_x": 1.5, "column_x": 2.0 + i, "rowcol_heads": []}
            for i in range(layers)]
    if rowcol_layer is not None:
        labels[rowcol_layer][1] = "column"
        rows[rowcol_layer]["rowcol_heads"] = [1]
    return {"labels": labels, "layers": rows}


def test_fig2_depth_section_answers_from_which_depth_rows_or_columns_appear():
    train = {str(L): {"test_bits": 5.0 - L / 10, "steps": 1500, "model_cfg": {
        "d_model": 64, "n_heads": 2}, "train_cfg": {"batch_size": 16},
        "machine": {"cpu": "CPU"}} for L in (2, 4)}
    none = {"train": train, "images": "16 test images",
            "models": {"2": _depth_summary(2, None), "4": _depth_summary(4, None)}}
    lines = results.fig2_depth_section(none)
    assert "| 2 | 4.800 | mixed 2, local 2 | 1.5x (0) | 3.0x (1) | none |" in lines
    assert lines[-1] == ("- No head of any depth is labelled row, column or row+column (most "
                         "of its pixel mass there): row/column attention does not appear up to "
                         "4 layers. The strongest lift is 5.0x uniform's (column, layer 3 of "
                         "the 4-layer model).")
    some = dict(none, models={"2": _depth_summary(2, None), "4": _depth_summary(4, 2)})
    lines = results.fig2_depth_section(some)
    assert "| 4 | 4.600 | mixed 4, local 3, column 1 | 1.5x (0) | 5.0x (3) | layer 2 h1 " \
           "(column) |" in lines
    assert lines[-1] == ("- Row/column attention appears from the 4-layer model on: heads "
                         "labelled row, column or row+column in the 4-layer model's layers 2.")


def test_profile_section_gives_each_part_of_a_step_as_a_share():
    cell = {"phases": {"data": 0.001, "forward": 0.1, "backward": 0.2, "clip": 0.004,
                       "optimizer": 0.005}, "op_shares": {"attention": 0.5, "matmul": 0.3,
                                                          "other": 0.2},
            "op_calls": 4000, "dispatch_s": 0.0062, "eval_item_s": 0.01,
            "per_token_s": [6e-5, 6.1e-5, 5.9e-5]}
    prof = {"cells": {"text/full": cell}, "conditions": {
        "machine": "CPU, 2 cores", "torch": "2.13.0", "threads": 1,
        "kernels": {"aten_cpu_capability": "AVX2"}, "steps": 6, "warmup": 2,
        "batches": [8, 16, 32]}}
    lines = results.profile_section(prof)
    assert "| text/full | 310 ms | 32.3% | 64.5% | 1.6% | 1.3% | 0.3% | 50% | 30% | 20% " \
           "| 4000 | 2% | 10.0 ms | 60 us / 61 us / 59 us | - | - | - |" in lines
    cell["host_kernels"] = {"phases": {"forward": 0.1, "backward": 0.18},
                            "kernels": {"aten_cpu_capability": "AVX512"}}
    assert results.profile_section(prof)[-1].endswith("| 280 ms (AVX512) | - | - |")
    # the compiled step and, for a dense cell, its attention through SDPA against the window
    # kernel, and dense attention's two kernels side by side
    cell["compiled"] = {"step_s": 0.3, "eager_step_s": 0.31, "compile_s": 41.0}
    cell["dense_attention"] = {"window": 0.25, "sdpa": 0.31}
    prof["dense_kernels"] = [{"n": 512, "d": 16, "batch": 8, "heads": 4, "sdpa_fwd_s": 0.014,
                              "window_fwd_s": 0.0105, "sdpa_fb_s": 0.054,
                              "window_fb_s": 0.0315}]
    lines = results.profile_section(prof)
    row = next(line for line in lines if line.startswith("| text/full |"))
    assert row.endswith("| 280 ms (AVX512) | 0.97x (41 CPU s) | 250 / 310 ms (0.81x) |")
    assert lines[-1] == "| 512 | 16 | 14.0 ms | 10.5 ms | 0.75 | 54.0 ms | 31.5 ms | 0.58 |"


def test_drift_section_sets_the_kernels_move_beside_the_seed_spread():
    """``table2 --drift`` on an AVX-512 host: seed 0 with the host's own kernels instead of
    the pinned AVX2 ones, its move beside the spread over seeds."""
    runs = {"text/full": {"0": {"test_bits": 4.0}, "1": {"test_bits": 4.2}}}
    lines = results.drift_section({"runs": runs, "drift_kernels": {
        "text/full": {"test_bits": 4.0000002}}})
    assert "AVX2 kernels pinned" in lines[0] and "AVX-512 host's own kernels" in lines[-1]
    assert "text/full 2e-07, seed std 0.14 (bits)." in lines[-1]


def test_output_init_section_compares_the_same_seeds():
    drawn = {"text/full": {str(s): {"test_bits": 4.0 + 0.01 * s} for s in range(3)}}
    zero = {"runs": {"text/full": {str(s): {"test_bits": 4.4 + 0.01 * s - 0.02 * (s == 2),
                                            "steps": 160} for s in range(3)}}}
    line = results.output_init_section({"runs": drawn}, zero)[0]
    assert "160 steps" in line and "text/full +0.393 (worse in 3 of 3 seeds; seed std 0.010)" \
        in line
    # against runs of another length there is nothing to compare: said, not computed
    longer = {k: {s: {**r, "steps": 480} for s, r in v.items()} for k, v in drawn.items()}
    line = results.output_init_section({"runs": longer}, zero)[0]
    assert "measured at 160 steps" in line and "480 steps now: not comparable" in line
    # ... unless the Table 2 record of that length is kept: then against it, named
    same = {k: {s: {**r, "steps": 160} for s, r in v.items()} for k, v in drawn.items()}
    line = results.output_init_section({"runs": longer}, zero, {"runs": same})[0]
    assert "160 steps" in line and "kept in figures/data/table2_160_steps.json" in line \
        and "text/full +0.393 (worse in 3 of 3 seeds" in line
    assert results.output_init_section({"runs": longer}, zero, {"runs": longer})[0] \
        .endswith("480 steps now: not comparable; rerun it to compare.")


def test_output_init_lines_read_the_three_records_from_one_folder(tmp_path):
    """The W_out = 0 line the README and notebooks 05 and 08 print comes from one call on a
    folder: against the kept Table 2 record of the W_out = 0 runs' length where today's
    Table 2 trains another, as ``report`` prints it; a folder without Table 2 says so."""
    def runs(bits, steps):
        return {"runs": {"text/full": {str(s): {"test_bits": b, "steps": steps,
                                                "model_cfg": {"n_ctx": 64}}
                                       for s, b in enumerate(bits)}}}
    files = {results.ZERO: runs([4.4, 4.5], 160), "table2.json": runs([3.6, 3.7], 480),
             results.KEPT_T2: runs([4.0, 4.2], 160)}
    for name, record in files.items():
        (tmp_path / name).write_text(json.dumps(record))
    line = results.output_init_lines(tmp_path)[0]
    assert "kept in figures/data/table2_160_steps.json" in line \
        and "text/full +0.350 (worse in 2 of 2 seeds; seed std 0.141)" in line
    committed = ROOT / "figures" / "data"
    assert results.output_init_lines(committed)[0] in results.report(committed)[0]
    (tmp_path / results.KEPT_T2).unlink()
    assert results.output_init_lines(tmp_path)[0].endswith(
        "against Table 2 runs of 480 steps now: not comparable; rerun it to compare.")
    (tmp_path / "table2.json").unlink()
    assert "against no Table 2 record (figures/data/table2.json) now" \
        in results.output_init_lines(tmp_path)[0]
    (tmp_path / results.ZERO).unlink()
    assert results.output_init_lines(tmp_path)[0].startswith(
        f"Output layer at initialisation: no {results.ZERO} in {tmp_path}")


def test_fig2_depth_section_of_a_run_still_training_says_so():
    lines = results.fig2_depth_section({"train": {"24": {}, "6": {}}})
    assert lines == ["Figure 2 against depth, `python -m fast fig2 --depth`: models of 6, 24 "
                     "layers trained, not measured yet (run it again to measure them)."]


def test_the_gpu_records_load_in_one_call_with_their_provenance():
    """What notebook 04 prints: the committed GPU records, shape-checked, and their sections."""
    got = results.gpu_results()
    assert got["variants"]["provenance"]["commit"] == "81a3fc0"
    assert got["bench"]["machine"]["gpu"] == got["train_time"]["machine"]["gpu"] == "NVIDIA H200"
    text = got["text"]
    assert text.count("NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, main at 81a3fc0, "
                      "2026-11-28") == 3
    assert "| triton block-sparse (fused) | 0.690 ms (6.73x) | 0.698 ms (7.28x) |" in text
    assert "kernel variant baseline, its first FlexAttention peer" in text
    empty = results.gpu_results(ROOT / "tests")            # a folder without them
    assert empty["bench"] is None and empty["text"] == ""


def test_the_attention_free_floor_says_how_much_of_the_papers_speed_up_is_attainable(tmp_path,
                                                                                   capsys):
    def row(pattern, s):
        return {"shape": "enwik8", "pattern": pattern, "s_per_iter": s, "n": 12288, "d": 512,
                "heads": 8, "layers": 6, "syncs_per_step": 1}

    record = {"machine": {"gpu": "Test GPU", "torch": "2.x"},
              "config": {"batch": 8, "warm": 3, "steps": 5},
              "rows": [row("none", 0.080), row("full", 0.200), row("fixed", 0.150),
                       row("strided", 0.100)]}
    (tmp_path / "gpu_iteration_time.json").write_text(json.dumps(record))
    text = results.gpu_results(tmp_path)["text"]
    print(text)
    assert "| enwik8 (n=12288, d=512, 8 heads, 6 layers) | attention-free (floor) | 80.0 | - |" \
        in text
    assert "| strided | 100.0 | 2.00x | 20.0 ms | 1 | 0.35 s (3.74x) |" in text
    # dense / floor = 2.5x attainable: short of the paper's strided 3.74x, enough for 2.38x
    assert "takes 80.0 ms (the floor): at most 2.50x is attainable now, short of it." in text
    assert "fixed: 1.33x dense here, the paper's 2.38x" in text
    assert text.count("at most 2.50x is attainable now, enough.") == 1
    assert results_command.main(["--data", str(tmp_path)]) == 0
    assert "Table 2's time per iteration on a GPU" in capsys.readouterr().out


def test_the_readme_holds_every_line_the_committed_results_print(capsys):
    """README.md's result tables are ``python -m fast results``'s output over the committed
    figures/data: a line that changed there (a re-run, a new column) and not in the README
    is stale prose of numbers."""
    assert results_command.main([]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    readme = set((ROOT / "README.md").read_text().splitlines())
    stale = [line for line in printed if line not in readme]
    assert len(printed) > 50 and not stale, stale


def test_the_papers_orderings_are_restated_pair_by_pair_with_their_spread():
    """Each adjacent pair of the paper's order: held or not in every seed, the paired
    per-seed margins with their mean and std over seeds, and the held-out sampling error."""
    bits = {"full": (3.50, 3.52, 3.48), "fixed": (3.40, 3.45, 3.41),
            "strided": (3.42, 3.43, 3.56)}
    runs = {f"{m}/{p}": {str(s): {"test_bits": b, "test_se": 0.004 if p == "full" else 0.002}
                         for s, b in enumerate(values)}
            for m in ("text", "image") for p, values in bits.items()}
    lines = results.paper_orderings({"runs": runs, "paper": PAPER})
    text, image = lines
    assert text.startswith("- The paper's order on text, fixed < dense < strided: ")
    # fixed below dense in every seed: +0.10, +0.07, +0.07
    assert ("fixed < dense (paper 0.99 < 1.00) holds in all 3 seeds, dense - fixed = +0.080 "
            "± 0.017 (mean ± std over seeds; per seed +0.100, +0.070, +0.070)") in text
    assert "dense < strided (paper 1.00 < 1.13) holds in 1 of 3 seeds only (not settled)" in text
    assert "sampling error of at most 0.004" in text
    # images: strided < dense < fixed; dense is above fixed in every seed: reversed
    assert "dense < fixed (paper 2.82 < 2.85) reversed in all 3 seeds" in image


def test_cost_line_turns_the_runs_cpu_seconds_into_the_budget():
    runs = {"text/full": {"0": {"cpu_s": 100.0, "train_cpu_s": 90.0, "steps": 450},
                          "1": {"cpu_s": 110.0, "train_cpu_s": 90.0, "steps": 450}}}
    timing = [{"iter_times": [10.0, 20.0]}]
    line = results.cost_line({"runs": runs, "timing": timing, "jobs": 2})
    assert line == ("The 2 runs took 210 CPU seconds, 200 ms of training per step on average; "
                    "2 at a time that is about 2.2 minutes of an idle 2-core machine with the "
                    "timing runs (30 s).")
    assert results.cost_line({"runs": {"a": {"0": {"steps": 1}}}}) == ""


def test_gpu_timing_reads_the_gpu_record_or_says_it_is_missing():
    assert "missing" in results.gpu_timing(None)[0]
    gpu = {"machine": {"device": "NVIDIA H200"}, "rows": [
        {"shape": "enwik8", "pattern": p, "n": 12288, "batch": 8, "s_per_iter": s,
         "paper_s_per_iter": paper}
        for p, s, paper in (("full", 0.2, 1.31), ("fixed", 0.1, 0.55), ("strided", 0.05, 0.35),
                            ("none", 0.04, None))]}
    line = results.gpu_timing(gpu)[0]
    assert line.startswith("- GPU (NVIDIA H200), enwik8 shape (n = 12288, batch 8): ")
    assert "fixed 100.0 ms (0.50x; paper 0.42x)" in line
    assert "no attention (the floor) 40.0 ms (0.20x)" in line
