"""The notebooks' prose held to their outputs and to the paper: a checker that reads
the ``.ipynb`` files with nbformat (nothing is executed).

Child et al., 2019: notebooks 01-10 re-derive the paper (sec. 4-7) and quote it.
Hand-written conclusions drift from the outputs they describe, paraphrases get dressed
as quotes, section numbers go stale and words get used before they are explained. Five
rules make the house style enforceable ("a number or an ordering in prose is printed in
the same section, generated from the data, or asserted by a check cell"; "a quote is the
paper's exact words with its section"; "every term is defined before it is used"):

number
    Every number written in a markdown cell (integers, decimals, percentages, "3x",
    thousands written 12,288 or 16{,}384, 3.5e-4) appears, at the precision written, in
    the text outputs of the same section: the cells between two headings, any level. A
    cell marked ``NBVAL_IGNORE_OUTPUT`` or ``NBVAL_SKIP`` (in its source, or as the notebooks
    do, by the tag ``nbval-ignore-output`` or ``nbval-skip``) gives no evidence (nbval does
    not compare its outputs, so a number read off them is stale after the next run: such
    a sentence is printed by the cell itself). An integer may also be a parameter written
    in the section's code, and so may a bare value after "=" in math (``$l = 6$``).
    Not numbers of the prose: headings, inline code, links, HTML comments, list
    numbering, references (sec. 4.3, eq. 2-4, Figure 3(b), Table 2, notebook 02, §2),
    years, the rest of a formula (``$n^{1.5}$``, ``$2\\sqrt{n} + 1$``), numbers inside a
    quote of the paper, and a number the paper states (``PAPER_NUMBERS``) in a sentence
    that cites it (sec., Table, Figure, eq., "the paper") or in a paraphrase of it.
    Quantities written in words count too where they state an amount (``WORD_NUMBERS``:
    "above zero", "about a quarter", "a hundred", "twice as fast"): "zero" needs a printed
    0, the others a printed value within a quarter of theirs. Anything else is asserted
    by a named check cell: the markdown carries ``<!-- check: NAME -->`` and a code cell
    whose first line is ``# check: NAME`` contains ``assert`` and the number.
setting
    The sizes written in the parenthesis after a named experiment of the paper, "the
    paper's Enwik8 sizes ($n = 12{,}288$, $l = 128$)", are the paper's
    (``PAPER_SETTINGS``): n, l, c and d where the paper states them.
quote
    A blockquote either says it is a paraphrase (the word "paraphrase" in it), or ends
    with its section, ``(sec. 4.3)``, and every piece of it between ``[...]`` is the
    paper's exact words: found in that section's passages in ``PAPER_WORDS``.
reference
    "section 4" is ambiguous in a notebook that has sections of its own. The paper's are
    written "sec. 4.3" (and must exist in the paper); the notebook's own "§2" (a
    heading "## 2. ..." must exist); another file's "docs/design.md §6" or "notebook 05 §3"
    (that file's heading must exist). A reference that stands beside a noun ("the
    benchmark (§9)", "the benchmark's in §9", "the runs of §2") must point at the section
    whose heading has that noun when one heading alone has it: "the benchmark's in §8"
    where "## 9. The benchmark" is a finding.
term
    A defined term is written in bold in the markdown cell that defines it, and that cell
    carries the marker ``<!-- define: term -->`` (one marker per term; the term's words
    as it is used, in any case: ``<!-- define: merged head -->`` with "a **merged head**
    reads ..."). The glossary is every term so marked in the notebooks of one folder.
    In each notebook, a term's first use (in prose: not code, headings or the paper's
    quoted words; plural and hyphen or space between its words allowed) comes at or after
    its definition in that notebook, or its sentence links to a notebook that defines it
    (``[merged heads](01_attention_patterns.ipynb#terms)``, the anchor optional; a link to an
    anchor of the same notebook, ``[§1](#1.-The-words)``, where that notebook defines it).
    Notebook 01 defines the words every notebook uses; a later notebook links its first
    use of each to 01, or defines a word of its own where it first needs it.

pointer
    A section ends with one line that says where its code lives in the package, labelled
    ``*Where it lives:*`` in every notebook (no other label, such as "*In the package:*", on a
    line that names a module path). Module paths (```fast/...```, ```reference/...```,
    ```tests/...```) stay on that line, out of the running prose.

Not machine-checked: what a sentence claims beyond its numbers (an ordering such as
"fewest" or "faster", a mechanism, "one run at a time" beside a printed 2). A sentence
stating an ordering prints the numbers it orders in the same section, which the number
rule then holds, or a check cell asserts it.

    python -m tests.notebooks.notebook_prose notebooks/*.ipynb     # every finding, file and cell
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
from tests.conftest import ROOT


from tests.notebooks.paper_text import (  # noqa: F401  (re-exported)
    PAPER_HEADINGS,
    PAPER_NUMBERS,
    PAPER_SECTIONS,
    PAPER_SETTINGS,
    PAPER_WORDS,
)

IGNORED = ("NBVAL_IGNORE_OUTPUT", "NBVAL_SKIP")
IGNORED_TAGS = {"nbval-ignore-output", "nbval-skip"}
HEADING = re.compile(r"^#{1,6}\s")
CHECK_MARK = re.compile(r"<!--\s*check:\s*([\w-]+)\s*-->")
CHECK_CELL = re.compile(r"^\s*#\s*check:\s*([\w-]+)\s*$", re.M)
PAPER_CITE = re.compile(r"\b(?:[Ss]ecs?\.\s*\d|[Ee]qs?\.\s*\d|Table\s+\d|Figure\s+\d|Fig\.\s*\d"
                        r"|the paper|paper's|Child et al)")

# A reference list: "4.3", "3(b)", "2-4", "5.2 and 6" (one decimal digit: a section,
# not a measured number, so "Table 2, 1.31" keeps its 1.31).
_ITEM = r"\d+(?:\.\d)?(?:\([a-z]\))?(?![\d.]\d)"
_LIST = rf"{_ITEM}(?:\s*(?:[-–,]|\band\b|\bor\b|\bto\b)\s*{_ITEM})*"
REFERENCE = re.compile(rf"(?:\b(?:[Ss]ecs?\.|[Ee]qs?\.|[Ss]ections?|[Ee]quations?|Figures?|Fig\."
                       rf"|Tables?|[Nn]otebooks?)\s*|§\s*){_LIST}")
YEAR = re.compile(r"\(\s*(?:19|20)\d\d\s*\)|\b(?:January|February|March|April|May|June|July"
                  r"|August|September|October|November|December)\s+(?:19|20)\d\d\b"
                  r"|\bet al\.,?\s+(?:19|20)\d\d\b|arXiv[:\s]*\d{4}\.\d{4,5}(?:v\d)?")
# A number: 12,288 / 16{,}384 / 3.5 / 3.5e-4, then perhaps % or x; not part of a word.
NUMBER = re.compile(r"(?<![\w.,{}\\])(\d{1,3}(?:(?:,|\{,\})\d{3})+|\d+)(\.\d+)?(?:[eE]([-+−]?\d+))?"
                    r"(\s?%|\\%|x(?![\w])|\s?×|\s?\\times(?![a-z]))?(?![\w])")
MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+\$", re.S)
MATH_VALUE = re.compile(r"(?:=|\\approx)\s*(\d{1,3}(?:\{,\}\d{3})+|\d+(?:\.\d+)?)"
                        r"(?=\s*(?:$|[,;.)\]]|\\(?:dots|ldots|cdots|text|quad|qquad|[,;! ])|\\\}))")
EVIDENCE = re.compile(r"\d+(?:,\d{3})*(?:_\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Finding:
    path: str
    cell: int
    rule: str
    words: str
    why: str

    def __str__(self) -> str:
        return f"{self.path} cell {self.cell} [{self.rule}] {self.words!r}: {self.why}"


@dataclass(frozen=True)
class Number:
    """A number written in prose: its value, the precision written, what kind it is."""
    text: str
    value: float
    tol: float
    kind: str          # "int", "decimal", "percent", "times"
    in_math: bool = False

    def found_in(self, values: list[float]) -> bool:
        """Whether one of ``values`` (signs dropped) rounds to it; a percentage also matches
        the fraction (83% and 0.83)."""
        targets = [self.value] + ([self.value / 100] if self.kind == "percent" else [])
        tols = [self.tol] + ([self.tol / 100] if self.kind == "percent" else [])
        return any(abs(abs(x) - t) <= tol * (1 + 1e-9) + 1e-12
                   for x in values for t, tol in zip(targets, tols))


def _number(m: re.Match) -> Number:
    """The ``Number`` a match of ``NUMBER`` writes; its tolerance is half its last digit."""
    whole, frac, exp, suffix = m.group(1), m.group(2) or "", m.group(3), m.group(4)
    digits = whole.replace("{,}", "").replace(",", "")
    decimals = len(frac) - 1 if frac else 0
    scale = 10.0 ** int(exp.replace("−", "-")) if exp else 1.0
    value = float(digits + frac) * scale
    kind = ("percent" if suffix and "%" in suffix else "times" if suffix
            else "decimal" if frac or exp else "int")
    return Number(m.group(0).strip(), value, 0.5 * 10.0 ** -decimals * scale, kind)


def numbers_in(text: str) -> list[tuple[Number, int]]:
    """The numbers of a prose sentence (references and years already blanked by ``_prose``)
    with their positions: plain numbers outside math, bare values after "=" inside it."""
    found = []
    found += [(_number(m), m.start()) for m in NUMBER.finditer(_blank(MATH, text))]
    for math in MATH.finditer(text):
        for m in MATH_VALUE.finditer(math.group(0)):
            n = _number(NUMBER.search(m.group(1)))
            found.append((Number(n.text, n.value, n.tol, n.kind, in_math=True),
                          math.start() + m.start(1)))
    return sorted(found, key=lambda pair: pair[1])


def _values(text: str) -> list[float]:
    """Every number printed in (or written in the code of) a cell, as evidence."""
    values = []
    for token in EVIDENCE.findall(text):
        values.append(float(token.replace(",", "").replace("_", "")))
        if "," in token:                  # "[84,100]" printed without spaces: each piece too
            values += [float(p) for p in token.split(",") if p and "." not in p]
    return values


PAPER_VALUES = sorted({float(t.replace(",", "")) for v in PAPER_NUMBERS.values()
                       for t in v.split()})


def _blank(pattern: re.Pattern | str, text: str, flags: int = 0) -> str:
    """``text`` with every match of ``pattern`` replaced by spaces (positions kept)."""
    return re.sub(pattern, lambda m: " " * len(m.group(0)), text, flags=flags)


def _strip_markup(text: str) -> str:
    """Markdown with the parts that are not prose blanked: code, comments, links' targets,
    HTML tags, URLs."""
    for pattern in (r"```.*?```", r"<!--.*?-->", r"`[^`\n]*`", r"(?<=\])\([^)\s]*\)",
                    r"https?://\S+", r"<[^>\n]+>"):
        text = _blank(pattern, text, re.S)
    return text


def _prose(sentence: str) -> str:
    """A sentence without what is not a number of its prose: references, years, list
    numbering ("1. ", "(2)"), names such as CIFAR-10, "0-indexed". Positions are kept."""
    for pattern in (YEAR, REFERENCE, r"(?m)^\s*\d+[.)]\s", r"(?<![\w.])\d{1,2}\.(?=\s+[a-z*(])",
                    r"\(\d\)", r"\b[A-Za-z]+-\d+\b", r"\b[01]-indexed\b"):
        sentence = _blank(pattern, sentence)
    return sentence


def sentences(text: str) -> list[str]:
    """A markdown text cut into sentences, list items and table rows (the unit in which a
    number must cite the paper to be the paper's)."""
    parts = re.split(r"\n\s*\n|\n(?=\s*(?:[-*|]|\d+[.)])\s)|(?<=[.!?])\s+(?=[A-Z(])", text)
    return [p for p in parts if p.strip()]


def blockquotes(text: str) -> tuple[list[str], str]:
    """The blockquotes of a markdown text (each joined into one line) and the text
    without them."""
    quotes, rest, current = [], [], []
    for line in text.split("\n"):
        if line.lstrip().startswith(">"):
            current.append(re.sub(r"^\s*>\s?", "", line))
            continue
        if current:
            quotes.append(" ".join(current))
            current = []
        rest.append(line)
    if current:
        quotes.append(" ".join(current))
    return quotes, "\n".join(rest)


def _normal(text: str) -> str:
    text = text.replace("*", "").replace("’", "'").replace("\\leq", "\\le")
    return re.sub(r"\s+", " ", text).strip()


def quote_problem(quote: str) -> str | None:
    """Why a blockquote is neither the paper's exact words with its section nor a marked
    paraphrase; None when it is one of them."""
    if re.search(r"paraphras", quote, re.I):
        return None
    m = re.search(r"\(sec\.\s*(\d+(?:\.\d+)?)\)\s*$", quote)
    if m is None:
        return 'a quote ends with its section, "(sec. 4.3)", or says "paraphrase"'
    section = m.group(1)
    if section not in PAPER_WORDS:
        return f"no passage of sec. {section} in PAPER_WORDS (tests/notebooks/notebook_prose.py)"
    passages = [_normal(p) for p in PAPER_WORDS[section]]
    for piece in re.split(r"\[(?:\.\.\.|…)\]", quote[:m.start()]):
        piece = _normal(piece).strip(" .,;:")
        if re.search(r"[A-Za-z]", piece) and not any(piece in p for p in passages):
            words = piece.split()
            good = 0
            while good < len(words) and any(" ".join(words[:good + 1]) in p for p in passages):
                good += 1
            return (f"not the paper's words (sec. {section}) from "
                    f"{' '.join(words[max(0, good - 3):good + 6])!r}")
    return None


# Quantities written in words, where they state a measured amount: "above zero", "about a
# quarter", "a hundred", "twice as fast". "zero" is exact (a printed 0 holds it); the others
# are rough, so a printed value within a quarter of theirs holds them ("about a quarter" and
# 26%). Idioms are not quantities: "masked to zero", "no pair is read twice".
WORD_NUMBERS = {"zero": 0.0, "a third": 1 / 3, "a quarter": 0.25, "a fifth": 0.2,
                "a tenth": 0.1, "a hundredth": 0.01, "a thousandth": 0.001,
                "a hundred": 100.0, "a thousand": 1000.0, "twice": 2.0, "three times": 3.0,
                "four times": 4.0, "five times": 5.0, "ten times": 10.0}
_COMPARED_ZERO = ("(?:" + "|".join(f"(?<={w} )" for w in
                                   "above below under over than near from".split()) + ")zero")
_TWICE = r"twice(?= as | the | larger| smaller| faster| slower| more| fewer)"
WORD_NUMBER = re.compile(
    r"(?<![\w-])(" + _COMPARED_ZERO + "|" + _TWICE + "|"
    + "|".join(w for w in sorted(WORD_NUMBERS, key=len, reverse=True)
               if w not in ("zero", "twice")) + r")(?![\w-])", re.I)
ROUGH = 0.25


def word_numbers_in(text: str) -> list[tuple[str, float, int]]:
    """(words, value, position) of every quantity written in words in a prose sentence."""
    return [(m.group(0), WORD_NUMBERS[m.group(0).lower()], m.start())
            for m in WORD_NUMBER.finditer(_blank(MATH, text))]


def word_found_in(value: float, values: list[float]) -> bool:
    """Whether a printed value holds a quantity written in words: 0 exactly for "zero";
    within ``ROUGH`` of the value (or of its percentage) for the rest."""
    if value == 0.0:
        return any(x == 0.0 for x in values)
    return any(abs(abs(x) - t) <= ROUGH * t for x in values for t in (value, 100 * value))


# "the paper's Enwik8 sizes (n = 16384, l = 128)": the sizes in the parenthesis that follows
# a named experiment of the paper must be the paper's (PAPER_SETTINGS).
SETTING = re.compile(r"\b(?:the\s+)?paper's\s+(" + "|".join(PAPER_SETTINGS) + r")\b"
                     r"[^()\n.]{0,40}?\(([^()]*)\)")
ASSIGN = re.compile(r"(?<![\w\\])([nlcd])\s*=\s*(\d{1,3}(?:(?:,|\{,\})\d{3})+|\d+)(?![\d.]\d)")


def setting_problems(text: str) -> list[tuple[str, str]]:
    """(words, why) for each size of a named experiment of the paper that is not the paper's."""
    problems = []
    for m in SETTING.finditer(_strip_markup(text)):
        dataset, inside = m.group(1), m.group(2).replace("$", "")
        for a in ASSIGN.finditer(inside):
            symbol, value = a.group(1), int(re.sub(r"\{,\}|,", "", a.group(2)))
            want = PAPER_SETTINGS[dataset].get(symbol)
            if want is not None and value != want:
                problems.append((f"{m.group(0)[:50]}",
                                 f"the paper's {dataset} has {symbol} = {want:,}, not {value:,}"))
    return problems


# Defined terms (the glossary): ``<!-- define: TERM -->`` in the markdown cell that writes
# **TERM** in bold; a use of TERM before it must link to a notebook that defines it.
DEFINE = re.compile(r"<!--\s*define:\s*(.+?)\s*-->")
NOTEBOOK_LINK = re.compile(r"\]\(\s*(?:\./)?([\w.-]+\.ipynb)(?:#[^)\s]*)?\s*\)")
SAME_NOTEBOOK_LINK = re.compile(r"\]\(\s*#[^)\s]*\s*\)")


def term_pattern(term: str) -> re.Pattern:
    """A term's uses: its words in any case, hyphen or space between them, plural or not."""
    words = [re.escape(w) for w in re.split(r"[-\s]+", term.strip())]
    return re.compile(r"(?<![\w-])" + r"[-\s]?".join(words) + r"(?:s|es)?(?![\w])", re.I)


def definitions(nb) -> dict[str, int]:
    """{term: the first markdown cell that defines it} of one notebook."""
    found: dict[str, int] = {}
    for idx, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            for term in DEFINE.findall(cell.source):
                found.setdefault(term.lower(), idx)
    return found


def glossary(folder: Path, extra=None) -> dict[str, set[str]]:
    """{term: names of the notebooks in ``folder`` that define it}; ``extra`` = (name, nb)
    read already (the notebook being checked, perhaps outside the folder)."""
    books = {p.name: nbformat.read(p, as_version=4) for p in sorted(folder.glob("*.ipynb"))}
    if extra:
        books[extra[0]] = extra[1]
    terms: dict[str, set[str]] = {}
    for name, nb in books.items():
        for term in definitions(nb):
            terms.setdefault(term, set()).add(name)
    return terms


def _prose_of_cell(source: str) -> str:
    """A markdown cell's prose for term uses: markup, quotes (the paper's words) and headings
    blanked, positions kept (link texts stay: a linked use is a use)."""
    text = _strip_markup(source)
    lines = []
    for line in text.split("\n"):
        lines.append(" " * len(line) if HEADING.match(line) or line.lstrip().startswith(">")
                     else line)
    return "\n".join(lines)


_SENTENCE_END = re.compile(r"\n\s*\n|\n(?=\s*(?:[-*|]|\d+[.)])\s)|(?<=[.!?])\s+(?=[A-Z(])")


def _sentence_at(text: str, at: int) -> tuple[int, int]:
    """The span of the sentence (list item, table row) of ``text`` around position ``at``."""
    start, end = 0, len(text)
    for m in _SENTENCE_END.finditer(text):
        if m.end() <= at:
            start = m.end()
        elif m.start() >= at:
            end = m.start()
            break
    return start, end


def term_problems(nb, name: str, terms: dict[str, set[str]]) -> list[tuple[int, str, str]]:
    """(cell, words, why) for each defined term this notebook uses before its definition
    without a link to a notebook that defines it; and for each definition marker whose cell
    does not write the term in bold."""
    problems = []
    own = definitions(nb)
    for idx, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            bold = " ".join(re.findall(r"\*\*(.+?)\*\*", cell.source, re.S))
            for term in DEFINE.findall(cell.source):
                if not term_pattern(term).search(bold):
                    problems.append((idx, f"define: {term}",
                                     f"the defining cell writes **{term}** in bold"))
    for term, where in sorted(terms.items()):
        pattern = term_pattern(term)
        for idx, cell in enumerate(nb.cells):
            if cell.cell_type != "markdown":
                continue
            text = _prose_of_cell(cell.source)
            m = pattern.search(text)
            if m is None:
                continue
            if term in own and idx >= own[term]:
                break                                  # defined here, at or before its first use
            start, end = _sentence_at(text, m.start())
            links = set(NOTEBOOK_LINK.findall(cell.source[start:end]))
            if term in own and SAME_NOTEBOOK_LINK.search(cell.source[start:end]):
                links.add(name)                        # "[§1](#1.-The-words)": to this one
            if not links & where:
                defined = ", ".join(sorted(where))
                problems.append((idx, m.group(0),
                                 f'"{term}" is used before its definition ({defined}): define '
                                 f"it first or link its first use to {sorted(where)[0]}"))
            break
    return problems


def _heading_titles(lines) -> dict[str, str]:
    return {m.group(1): m.group(2) for line in lines
            if (m := re.match(r"^#{1,6}\s+(\d+)\.\s+(.*)", line))}


_STOP = frozenset("this that with from what when where which their them they does than each "
                  "into over your also only more most same other these those here there how "
                  "why".split())


def _topic_words(text: str) -> list[str]:
    """The content words of a heading or of the words before a reference, singular and
    without a possessive."""
    words = []
    for w in re.findall(r"[A-Za-z][A-Za-z-]+", re.sub(r"\$[^$]*\$", " ", text)):
        w = re.sub(r"'s$", "", w.lower())
        w = w[:-1] if len(w) > 4 and w.endswith("s") and not w.endswith("ss") else w
        if len(w) >= 4 and w not in _STOP:
            words.append(w)
    return words


_LINKING = frozenset("in of at from see the".split())


def _named_before(before: str) -> str | None:
    """The noun a reference stands beside: "the benchmark (§9)", "the benchmark's in §9",
    "the runs of §2" name benchmark and run; "printed in §2 and §3" names nothing for §3."""
    tokens = re.findall(r"\S+", before.rstrip(" ("))
    skipped = 0
    while tokens and tokens[-1].lower() in _LINKING and skipped < 1:
        tokens.pop()
        skipped += 1
    if not tokens or not re.fullmatch(r"[A-Za-z][A-Za-z-]*(?:'s)?", tokens[-1]):
        return None
    words = _topic_words(tokens[-1])
    return words[0] if words else None


def topic_problem(before: str, number: str, titles: dict[str, str]) -> str | None:
    """Why "§number" does not name the section that the noun just before it names: the noun
    is a word of one other heading alone, not of heading ``number``."""
    noun = _named_before(before)
    if noun is None or number not in titles:
        return None
    owners = {key for key, title in titles.items() if noun in _topic_words(title)}
    if len(owners) != 1 or number in owners:
        return None
    (other,) = owners
    return f'"{noun}" is §{other} ("{titles[other]}"); §{number} is "{titles[number]}"'


def _headings(lines) -> set[str]:
    return set(_heading_titles(lines))


def _notebook_titles(nb) -> dict[str, str]:
    return _heading_titles(line for c in nb.cells if c.cell_type == "markdown"
                           for line in c.source.split("\n"))


def _notebook_headings(nb) -> set[str]:
    return set(_notebook_titles(nb))


POINTER_LABEL = "Where it lives"
LABEL_LINE = re.compile(r"^\s*\*([A-Z][^*:\n]{1,40}):\*")
MODULE_PATH = re.compile(r"`((?:fast|reference|tests)/[^`\s]*)`")


def pointer_problems(text: str) -> list[tuple[str, str]]:
    """(words, why) for a package pointer under another label than ``*Where it lives:*``,
    and for a module path written in running prose instead of on that line."""
    problems = []
    for line in text.split("\n"):
        label = LABEL_LINE.match(line)
        paths = MODULE_PATH.findall(line)
        if label and label.group(1) == POINTER_LABEL:
            continue
        if label and paths:
            problems.append((f"*{label.group(1)}:*",
                             f'the package pointer\'s label is "*{POINTER_LABEL}:*" in every notebook'))
            continue
        for path in paths:
            problems.append((path, f'a module path goes on the section\'s "*{POINTER_LABEL}:*" '
                                   "line, not in running prose"))
    return problems


def reference_problems(text: str, own: dict[str, str] | set[str],
                       root: Path = ROOT) -> list[tuple[str, str]]:
    """(words, why) for each ambiguous, dangling or misnamed section reference of a markdown
    text; ``own``: this notebook's headings, {number: title}."""
    problems = []
    own = own if isinstance(own, dict) else {k: "" for k in own}
    text = _strip_markup(text)
    for m in re.finditer(r"\b[Ss]ections?\s+\d+(?:\.\d+)?", text):
        problems.append((m.group(0), 'write "sec. N" for the paper, "§N" for this notebook'))
    for m in re.finditer(r"\b[Ss]ecs?\.\s*(\d+(?:\.\d+)?)(?:\s*[-–]\s*(\d+(?:\.\d+)?))?", text):
        for s in filter(None, m.groups()):
            if s not in PAPER_SECTIONS:
                problems.append((m.group(0), f"the paper has no sec. {s}"))
    for m in re.finditer(r"(\S+\.md|[Nn]otebook\s+(\d\d)\]?)?\s*§\s*(\d+)", text):
        where, other, number = m.groups()
        if where and where.endswith(".md"):
            path = root / where.strip("(*")
            titles = _heading_titles(path.read_text().split("\n")) if path.is_file() else {}
            name = where
        elif other:
            paths = sorted((root / "notebooks").glob(f"{other}_*.ipynb"))
            titles = _notebook_titles(nbformat.read(paths[0], as_version=4)) if paths else {}
            name = f"notebook {other}"
        else:
            titles, name = own, "this notebook"
        if number not in titles:
            problems.append((" ".join(m.group(0).replace("]", " ").split()),
                             f'{name} has no heading "{number}. ..."'))
            continue
        start, _ = _sentence_at(text, m.start())
        before = text[start:m.start()]
        if before.rstrip().endswith("(") and not text[m.end():].lstrip().startswith(")"):
            continue                        # "(§3 prints both)": a pointer, not a name
        why = topic_problem(before, number, titles)
        if why:
            problems.append((" ".join(m.group(0).replace("]", " ").split()), f"{name}: {why}"))
    return problems


@dataclass
class _Section:
    outputs: list[float]
    code: list[float]


def _output_text(cell) -> str:
    texts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream" and out.get("name") == "stdout":
            texts.append(out.get("text", ""))
        elif out.get("output_type") in ("execute_result", "display_data"):
            data = out.get("data", {})
            texts += [data.get(k, "") for k in ("text/plain", "text/markdown")]
    return "\n".join(t if isinstance(t, str) else "".join(t) for t in texts)


def _uncompared(cell) -> bool:
    """Whether nbval leaves the cell's outputs uncompared (a marker in its source, a tag)."""
    return (any(flag in cell.source for flag in IGNORED)
            or bool(IGNORED_TAGS & set(cell.get("metadata", {}).get("tags", ()))))


def check_notebook(path: str | Path, root: Path = ROOT) -> list[Finding]:
    """Every finding of the rules in one notebook."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    name = path.name
    own = _notebook_titles(nb)
    checks: dict[str, list] = {}
    for idx, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            for label in CHECK_CELL.findall(cell.source.split("\n", 1)[0]):
                checks.setdefault(label, []).append((idx, cell))

    # Sections: each markdown line goes to the section open where it stands.
    sections = [_Section([], [])]
    segments = []                     # (cell index, section index, markdown text)
    for idx, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            lines = []
            for line in cell.source.split("\n"):
                if HEADING.match(line):
                    if lines:
                        segments.append((idx, len(sections) - 1, "\n".join(lines)))
                    sections.append(_Section([], []))
                    lines = []
                else:
                    lines.append(line)
            if lines:
                segments.append((idx, len(sections) - 1, "\n".join(lines)))
        elif cell.cell_type == "code":
            sections[-1].code += _values(cell.source)
            if not _uncompared(cell):
                sections[-1].outputs += _values(_output_text(cell))

    findings = []
    for idx, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            for words, why in reference_problems(cell.source, own, root):
                findings.append(Finding(name, idx, "reference", words, why))
            for words, why in setting_problems(cell.source):
                findings.append(Finding(name, idx, "setting", words, why))
            for words, why in pointer_problems(cell.source):
                findings.append(Finding(name, idx, "pointer", words, why))
    terms = glossary(path.parent, (name, nb))
    for idx, words, why in term_problems(nb, name, terms):
        findings.append(Finding(name, idx, "term", words, why))

    for idx, sec, text in segments:
        extra_out = []
        for label in CHECK_MARK.findall(text):
            cells = checks.get(label, [])
            if len(cells) != 1:
                findings.append(Finding(name, idx, "number", f"check: {label}",
                                        f"{len(cells)} code cells start with '# check: {label}'"
                                        " (one asserts what this cell says)"))
            elif "assert" not in cells[0][1].source:
                findings.append(Finding(name, idx, "number", f"check: {label}",
                                        f"cell {cells[0][0]} asserts nothing"))
            else:
                extra_out += _values(cells[0][1].source) + _values(_output_text(cells[0][1]))
        quotes, rest = blockquotes(_strip_markup(text))
        for quote in quotes:
            problem = quote_problem(quote)
            if problem:
                findings.append(Finding(name, idx, "quote", quote[:60] + "...", problem))
        paraphrases = [q for q in quotes if re.search(r"paraphras", q, re.I)]
        outputs = sections[sec].outputs + extra_out
        code = sections[sec].code
        for sentence, cited in ([(s, False) for s in sentences(rest)]
                                + [(s, True) for q in paraphrases for s in sentences(q)]):
            cites = cited or bool(PAPER_CITE.search(sentence))
            for number, at in numbers_in(_prose(sentence)):
                if number.found_in(outputs):
                    continue
                if (number.kind == "int" or number.in_math) and number.found_in(code):
                    continue
                if cites and number.kind in ("int", "decimal") and any(
                        abs(number.value - v) <= 1e-9 * max(1.0, v) for v in PAPER_VALUES):
                    continue
                snippet = re.sub(r"\s+", " ", sentence[max(0, at - 40): at + len(number.text) + 25])
                findings.append(Finding(name, idx, "number", number.text,
                                        f"not in this section's compared outputs: ...{snippet}..."))
            if cited:
                continue
            for words, value, at in word_numbers_in(_prose(sentence)):
                if not word_found_in(value, outputs):
                    snippet = re.sub(r"\s+", " ", sentence[max(0, at - 40): at + len(words) + 25])
                    findings.append(Finding(name, idx, "number", words,
                                            "a quantity in words, not in this section's compared "
                                            f"outputs: ...{snippet}..."))
    return findings


def main(argv: list[str]) -> int:
    findings = [f for path in argv for f in check_notebook(path)]
    for f in findings:
        print(f)
    print(f"{len(findings)} findings in {len(argv)} notebooks")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
