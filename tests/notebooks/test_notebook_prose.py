"""The notebooks' prose says only what their outputs and the paper say (``notebook_prose``).

Child et al., 2019: the notebooks re-derive and quote the paper (sec. 4-7). The
checker reads the committed ``.ipynb`` files (no execution); its rules are in
``tests/notebooks/notebook_prose.py``. Each rule is shown to fire on a small notebook built
here, and a changed number in notebook 01's prose is shown to be caught.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from tests.notebooks.notebook_prose import PAPER_NUMBERS, PAPER_SECTIONS, PAPER_WORDS, check_notebook
from tests.conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_prose_is_held_by_outputs_and_the_paper(path):
    findings = check_notebook(path)
    assert not findings, "\n" + "\n".join(map(str, findings))


def test_the_paper_registries_name_its_sections():
    assert set(PAPER_WORDS) <= PAPER_SECTIONS
    for where in PAPER_NUMBERS:
        m = re.match(r"sec\. (\S+)$", where)
        assert m is None or m.group(1) in PAPER_SECTIONS, where


# ---------------------------------------------------------------------------
# Each rule, on a notebook built here.
# ---------------------------------------------------------------------------

def _write(tmp_path, cells) -> Path:
    """A notebook from (kind, source[, printed]) tuples: kind "md" or "code"."""
    nb = nbformat.v4.new_notebook()
    for kind, source, *printed in cells:
        if kind == "md":
            nb.cells.append(nbformat.v4.new_markdown_cell(source))
        else:
            cell = nbformat.v4.new_code_cell(source)
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=t)
                            for t in printed]
            nb.cells.append(cell)
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    return path


def _found(tmp_path, cells) -> list[tuple[str, str]]:
    return [(f.rule, f.words) for f in check_notebook(_write(tmp_path, cells))]


@pytest.mark.parametrize("prose, printed, flagged", [
    ("the slope is 1.35", "slope 1.351", []),
    ("the slope is 1.35", "slope 1.36", [("number", "1.35")]),       # printed 1.36, said 1.35
    ("both near 1.5", "ratio 1.46", []),                               # at the precision written
    ("83% of the mass", "share 0.83", []),
    ("83% of the mass", "share 83.2%", []),
    ("falls about 10x", "2500 then 250", [("number", "10x")]),
    ("about 3x faster", "ratio 2.96", []),
    ("over 24 held-out crops", "32 crops", [("number", "24")]),
    ("the context of 12,288", "n = 12288", []),
    ("$2^{14} = 16{,}384$ keys", "16384", []),
    ("a peak of 3.5e-4", "lr 0.00035", []),
    ("sec. 4.3, eq. 2-4, Figure 3(b), Table 2, notebook 02, (2019)", "", []),
    ("1. first step, 2. second", "", []),
    ("its lse is $-\\infty$ and $n^{1.5}$ grows as $2\\sqrt{n} + 1$", "", []),
])
def test_a_number_in_prose_is_printed_in_its_section(tmp_path, prose, printed, flagged):
    found = _found(tmp_path, [("md", "## 1. A section"), ("code", "x = 1", printed),
                              ("md", prose)])
    print(prose, "|", printed, "->", found)
    assert found == flagged


def test_a_number_printed_in_another_section_or_in_an_uncompared_cell_is_not_evidence(tmp_path):
    other = [("md", "## 1. One"), ("code", "x = 1", "took 4.25 s"), ("md", "## 2. Two"),
             ("md", "it took 4.25 s")]
    ignored = [("md", "## 1. One"), ("code", "# NBVAL_IGNORE_OUTPUT\nx = 1", "took 4.25 s"),
               ("md", "it took 4.25 s")]
    assert _found(tmp_path, other) == [("number", "4.25")]
    assert _found(tmp_path, ignored) == [("number", "4.25")]


def test_a_parameter_may_come_from_the_code_but_a_result_may_not(tmp_path):
    cells = [("md", "## 1. One"), ("code", "n, d, lr = 36, 48, 0.25"),
             ("md", "with $n = 36$, d = 48 and a rate of 0.25")]
    assert _found(tmp_path, cells) == [("number", "0.25")]


def test_a_number_of_the_paper_needs_the_paper_cited_in_its_sentence(tmp_path):
    cited = [("md", "Table 2 gives 1.31 s per iteration for dense attention.")]
    bare = [("md", "Dense attention takes 1.31 s per iteration.")]
    paraphrase = [("md", "> Paraphrase: dense attention takes 1.31 s per iteration.")]
    assert _found(tmp_path, cited) == []
    assert _found(tmp_path, bare) == [("number", "1.31")]
    assert _found(tmp_path, paraphrase) == []


def test_a_check_cell_named_by_the_prose_must_assert_its_numbers(tmp_path):
    prose = ("md", "## 2. Later\nthe slope is 1.35 <!-- check: slope -->")
    asserting = ("code", "# check: slope\nassert round(slope, 2) == 1.35")
    silent = ("code", "# check: slope\nprint(round(slope, 2) == 1.35)")
    wrong = ("code", "# check: slope\nassert round(slope, 2) == 1.36")
    assert _found(tmp_path, [asserting, prose]) == []
    assert _found(tmp_path, [silent, prose]) == [("number", "check: slope"),
                                                 ("number", "1.35")]
    assert _found(tmp_path, [wrong, prose]) == [("number", "1.35")]
    assert _found(tmp_path, [prose]) == [("number", "check: slope"), ("number", "1.35")]


@pytest.mark.parametrize("quote, flagged", [
    ("> Additionally, we found that when using multiple heads, having them attend to distinct "
     "subblocks of length $c$ within the block of size $l$ was preferable to having them "
     "attend to the same subblock. (sec. 4.3)", False),
    ("> A natural approach [...] is to have one head attend to the previous $l$ locations "
     "[...]. (sec. 4.3)", False),
    # the words 01 once presented as a quote of sec. 4.3
    ("> One approach is to have one head attend to the previous $l$ locations (sec. 4.3)", True),
    ("> Additionally, we found that when using multiple heads, having them attend to distinct "
     "subblocks of length $c$ within the block of size $l$ was preferable. (sec. 4.2)", True),
    ("> Additionally, we found that when using multiple heads, having them attend to distinct "
     "subblocks.", True),                                              # no section
    ("> One approach is to have one head attend to the last $l$ positions (sec. 7.2)", True),
    ("> *Paraphrase of sec. 5.1:* the heads may be interleaved, merged or many.", False),
])
def test_a_quote_is_the_papers_words_with_its_section_or_a_marked_paraphrase(
        tmp_path, quote, flagged):
    found = _found(tmp_path, [("md", quote)])
    print(found)
    assert [rule for rule, _ in found] == (["quote"] if flagged else [])


@pytest.mark.parametrize("prose, flagged", [
    ("as section 4.3 says", ["section 4.3"]),
    ("as Section 5.6 adds", ["Section 5.6"]),
    ("as sec. 4.3 says, and sec. 5.2-5.6", []),
    ("as sec. 4.7 says", ["sec. 4.7"]),
    ("measured in §1 of this notebook", []),
    ("measured in §3", ["§3"]),
    ("docs/design.md §6 says how", []),
    ("docs/design.md §60 says how", ["docs/design.md §60"]),
    ("notebook 01 §4 shows the order", []),
    ("notebook 01 §40 shows the order", ["notebook 01 §40"]),
])
def test_a_section_reference_says_whose_section(tmp_path, prose, flagged):
    found = _found(tmp_path, [("md", "## 1. One"), ("md", prose)])
    print(found)
    assert [words for rule, words in found if rule == "reference"] == flagged


# ---------------------------------------------------------------------------
# On the real notebooks: a changed number is caught.
# ---------------------------------------------------------------------------

# a decimal or a thousands number of the prose, outside math and code
_CLAIM = re.compile(r"(?<![\w.,$\\{])\d{1,3}(?:,\d{3})+(?![\w,])|(?<![\w.,$\\{])\d+\.\d+(?![\w.])")


@pytest.mark.parametrize("name", ["01_attention_patterns.ipynb", "02_reference_attention.ipynb",
                                  "10_use_it_in_your_model.ipynb"])
def test_every_changed_number_in_the_prose_is_caught(tmp_path, name):
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    before = len(check_notebook(ROOT / "notebooks" / name))
    mutated = 0
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        source = cell.source
        hidden = re.sub(r"\$\$.+?\$\$|\$[^$\n]+\$|`[^`\n]*`",
                        lambda m: "\0" * len(m.group(0)), source, flags=re.S)
        for m in _CLAIM.finditer(hidden):
            cell.source = source[:m.start()] + "917.25" + source[m.end():]
            path = tmp_path / name
            nbformat.write(nb, path)
            after = check_notebook(path)
            assert len(after) > before, f"{m.group(0)!r} changed in {source[:60]!r}... not caught"
            mutated += 1
        cell.source = source
    print(name, mutated, "numbers changed one at a time, each caught")
    assert mutated >= (10 if name.startswith("01") else 2)
