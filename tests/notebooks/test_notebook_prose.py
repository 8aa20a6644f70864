"""The notebooks' prose says only what their outputs and the paper say (``notebook_prose``).

Child et al., 2019: the notebooks re-derive and quote the paper (sec. 4-7). The
checker reads the committed ``.ipynb`` files (no execution); its rules are in
``tests/notebooks/notebook_prose.py``. Each rule is shown to fire on a small notebook built
here (each new rule on the sentence of the notebooks that it would have caught), and a changed
number in notebook 01's prose is shown to be caught.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from tests.conftest import ROOT
from tests.notebooks.notebook_prose import (
    PAPER_NUMBERS,
    PAPER_SECTIONS,
    PAPER_SETTINGS,
    PAPER_WORDS,
    check_notebook,
)

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_prose_is_held_by_outputs_and_the_paper(path):
    findings = check_notebook(path)
    assert not findings, "\n" + "\n".join(map(str, findings))


def test_the_paper_registries_name_its_sections():
    assert set(PAPER_WORDS) <= PAPER_SECTIONS
    assert set(PAPER_SETTINGS) == {"Enwik8", "CIFAR-10", "ImageNet"}
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
            if kind == "code-ignored":                        # tagged, as the notebooks do
                cell.metadata["tags"] = ["nbval-ignore-output"]
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
    tagged = [("md", "## 1. One"), ("code-ignored", "x = 1", "took 4.25 s"),
              ("md", "it took 4.25 s")]
    assert _found(tmp_path, other) == [("number", "4.25")]
    assert _found(tmp_path, ignored) == [("number", "4.25")]
    assert _found(tmp_path, tagged) == [("number", "4.25")]


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
    # notebook 08 once pointed at notebook 05's §2 through a link: it was read as its own §2
    ("[notebook 01](01_attention_patterns.ipynb) §4 shows the order", []),
    ("[notebook 01](01_attention_patterns.ipynb) §40 shows the order", ["notebook 01 §40"]),
])
def test_a_section_reference_says_whose_section(tmp_path, prose, flagged):
    found = _found(tmp_path, [("md", "## 1. One"), ("md", prose)])
    print(found)
    assert [words for rule, words in found if rule == "reference"] == flagged


@pytest.mark.parametrize("prose, printed, flagged", [
    # notebook 09 once said this beside a printed -0.06 (in a cell nbval does not compare)
    ("tops and bottoms of different crops paired at random -- still above zero", "-0.06",
     [("number", "zero")]),
    ("paired at random: near zero", "correlation 0.0", []),
    ("the sparse cache holds about a quarter", "28%", []),
    ("the sparse cache holds about a quarter", "0.50", [("number", "a quarter")]),
    ("a step is about a hundred small operations", "ops 4496", [("number", "a hundred")]),
    ("twice as fast", "ratio 1.9x", []),
    ("padding slots are masked to zero; no pair is read twice", "", []),      # idioms
])
def test_a_quantity_in_words_is_printed_in_its_section(tmp_path, prose, printed, flagged):
    found = _found(tmp_path, [("md", "## 1. A section"), ("code", "x = 1", printed),
                              ("md", prose)])
    print(prose, "|", printed, "->", found)
    assert found == flagged


@pytest.mark.parametrize("prose, flagged", [
    # notebook 03 once said this of n = 16,384; the paper's Enwik8 context is 12,288 (sec. 7.2)
    ("At the paper's Enwik8 sizes ($n = 16384$, $l = 128$, $c = 32$) they are small.",
     ["setting"]),
    ("At the paper's Enwik8 sizes ($n = 12{,}288$, $l = 128$, $c = 32$) they are small.", []),
    ("the paper's CIFAR-10 images (n = 3072, d = 256)", []),
    ("the paper's CIFAR-10 images (n = 1024)", ["setting"]),
    ("here n = 16384, unlike the paper's Enwik8 model", []),   # no sizes given for the paper
])
def test_the_sizes_of_a_named_experiment_of_the_paper_are_the_papers(tmp_path, prose, flagged):
    found = _found(tmp_path, [("md", prose)])
    print(found)
    assert [rule for rule, _ in found if rule == "setting"] == flagged


@pytest.mark.parametrize("prose, flagged", [
    # notebook 03 once said this where "## 9. The benchmark" was its benchmark
    ("With $l$ fixed (128, the paper's text setting in sec. 7.2, and the benchmark's in §8)",
     ["§8"]),
    ("the benchmark's in §9", []),
    ("the benchmark (§8)", ["§8"]),
    ("the benchmark (§9)", []),
    ("the heads one after another (§8)", []),
    ("their sequences short (§8 prints both)", []),        # a pointer, not a name
    ("printed per head in §8 and §9", []),                 # §9 stands beside no noun
])
def test_a_reference_beside_a_noun_points_at_the_section_named_by_it(tmp_path, prose, flagged):
    cells = [("md", "## 8. Heads one after another (sec. 5.1)"), ("md", "## 9. The benchmark"),
             ("md", prose)]
    found = _found(tmp_path, cells)
    print(found)
    assert [words for rule, words in found if rule == "reference"] == flagged


@pytest.mark.parametrize("prose, flagged", [
    ("*Where it lives:* `fast/attention/api.py` (`sparse_attention`).", []),
    # notebooks 06-10 once labelled the same line differently
    ("*In the package:* `fast/attention/api.py` (`sparse_attention`).", ["*In the package:*"]),
    ("*Pre-activation*: each branch normalises its own input.", []),
    # notebook 09 once cited a test file in an explanatory paragraph
    ("The tests check it for every cache (`tests/fast/transformer/decoding/test_decode.py`).",
     ["tests/fast/transformer/decoding/test_decode.py"]),
    ("`docs/examples/tiny_gpt.py` is the same model as a script; `figures/data/table2.json` "
     "holds the runs", []),
])
def test_a_package_pointer_is_one_labelled_line(tmp_path, prose, flagged):
    found = _found(tmp_path, [("md", prose)])
    assert [words for rule, words in found if rule == "pointer"] == flagged


def _book(folder: Path, name: str, sources) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(s) for s in sources]
    folder.mkdir(exist_ok=True)
    nbformat.write(nb, folder / name)
    return folder / name


MERGED = ("<!-- define: merged head -->\nA **merged head** reads the union of the two "
          "heads' positions.")


def test_a_term_is_used_at_or_after_its_definition(tmp_path):
    # notebook 01 once used "merged" in its first cell; notebook 02 defined it
    early = _book(tmp_path, "01_a.ipynb", ["# 01\n\nA merged head reads them once.", MERGED])
    late = _book(tmp_path / "b", "01_a.ipynb", ["# 01", MERGED, "The merged heads read more."])
    in_quote = _book(tmp_path / "c", "01_a.ipynb",
                     ["> which we call a *merged* head (sec. 5.1)", "## 1. Merged heads", MERGED])
    assert [(f.rule, f.cell, f.words) for f in check_notebook(early)] == [
        ("term", 0, "merged head")]
    assert check_notebook(late) == []
    assert check_notebook(in_quote) == []            # the paper's words and headings are not uses
    pointed = _book(tmp_path / "d", "01_a.ipynb",
                    ["# 01\n\nA merged head ([§1](#1.-Words)) reads them once.",
                     "## 1. Words\n" + MERGED])
    assert check_notebook(pointed) == []             # a link to where this notebook defines it


def test_a_term_defined_in_another_notebook_links_its_first_use(tmp_path):
    _book(tmp_path, "01_terms.ipynb", ["# 01", MERGED])
    bare = _book(tmp_path, "02_b.ipynb", ["# 02\n\nEvery layer has two merged heads."])
    assert [(f.rule, f.words) for f in check_notebook(bare)] == [("term", "merged heads")]
    linked = _book(tmp_path, "02_b.ipynb", [
        "# 02\n\nEvery layer has two [merged heads](01_terms.ipynb#terms). Merged heads read "
        "more."])
    assert check_notebook(linked) == []
    elsewhere = _book(tmp_path, "02_b.ipynb", [
        "# 02\n\nEvery layer has two merged heads. See [notebook 01](01_terms.ipynb)."])
    assert [f.rule for f in check_notebook(elsewhere)] == ["term"]   # the link is in its sentence


def test_a_definition_writes_its_term_in_bold(tmp_path):
    path = _book(tmp_path, "01_a.ipynb", ["<!-- define: stride -->\nThe stride l is the period."])
    assert [(f.rule, f.words) for f in check_notebook(path)] == [("term", "define: stride")]


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
