"""The paper's words in quotation marks are its exact words: a checker over README.md,
docs/*.md and the docstrings of ``reference/``, ``fast/`` and ``docs/examples/`` (read
with ``ast``, nothing is imported).

Child et al., 2019 is quoted across the project (sec. 4-7). The house rule ("a quote is
the paper's exact words with its section") is held in the notebooks' blockquotes by
``tests/notebooks/notebook_prose.py``; here it is held in the rest of the prose:

quote
    A double-quoted span ("..." or “...”) of at least three words that stands in a
    sentence, or a parenthesis, citing the paper ("sec. 5.5", "section 4.3",
    "Child et al", "the paper") is found, after the notebook checker's normalisation
    (emphasis and LaTeX dollar signs dropped, spaces collapsed), in the passages of
    ``PAPER_WORDS``, or is a heading of ``PAPER_HEADINGS``: those of the sections the
    sentence names, else (it names none) any section's; the title goes anywhere. A
    paraphrase is written without quotation marks.

Not prose: code blocks and inline code (markdown backticks, docstrings' double
backticks), and a span broken by a blank line.

    python -m tests.paper_quotes           # every finding, file and line
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT
from tests.notebooks.notebook_prose import PAPER_HEADINGS, PAPER_WORDS, _normal

# A sentence (or parenthesis) cites the paper with one of these.
CITE = re.compile(r"\b(?:[Ss]ecs?\.\s*\d|[Ss]ections?\s+\d|Child et al|[Tt]he paper\b|[Pp]aper's)")
# The sections a reference names: "sec. 4.3", "secs. 4.3 and 5.5", "sections 5.2-5.6, 6".
_ITEM = r"\d+(?:\.\d+)?"
SECTION = re.compile(rf"\b(?:[Ss]ecs?\.|[Ss]ections?)\s*({_ITEM}(?:\s*(?:[-–,]|\band\b|\bor\b)\s*"
                     rf"{_ITEM}(?![\d.]\d))*)")
# A double-quoted span, straight or curly, not across a blank line.
QUOTED = re.compile(r'"((?:(?!\n\s*\n)[^"])+)"|“((?:(?!\n\s*\n)[^”])+)”')
# Where a sentence ends (the notebook checker's rule) or a paragraph does.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(*])|\n\s*\n")
CODE = (r"```.*?```", r"``[^`]*``", r"`[^`\n]*`", r"<!--.*?-->", r"https?://\S+")


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    quote: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.quote!r}: {self.why}"


def _blank(pattern: str, text: str) -> str:
    return re.sub(pattern, lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def _plain(text: str) -> str:
    """``_normal`` with LaTeX dollar signs and backslashes dropped: docstrings write math
    as text (``n/l``), ``PAPER_WORDS`` as LaTeX (``$n/l$``)."""
    return _normal(text.replace("$", "").replace("\\", "")).strip(" .,;:")


# Each section's passages and its heading; the title belongs to every section.
PASSAGES = {section: [_plain(p) for p in (*PAPER_WORDS.get(section, ()), heading,
                                          PAPER_HEADINGS[""])]
            for section, heading in PAPER_HEADINGS.items() if section}


def _sentence(text: str, start: int, end: int) -> tuple[int, int]:
    """The sentence (or paragraph) around [start, end)."""
    lo = max((m.end() for m in SENTENCE_END.finditer(text, 0, start)), default=0)
    m = SENTENCE_END.search(text, end)
    return lo, (m.start() if m else len(text))


def _parenthesis(text: str, start: int, end: int, lo: int, hi: int) -> tuple[int, int] | None:
    """The innermost parenthesis of text[lo:hi] around [start, end), if any."""
    depth = 0
    for i in range(start - 1, lo - 1, -1):
        if text[i] == ")":
            depth += 1
        elif text[i] == "(":
            if depth == 0:
                right = text.find(")", end, hi)
                return (i, right + 1) if right != -1 else None
            depth -= 1
    return None


def _sections(text: str) -> list[str]:
    """The paper's sections a text names, ranges ("5.2-5.6") filled in."""
    order = list(PASSAGES)
    named = []
    for listed in SECTION.findall(text):
        for item in re.split(r"\s*(?:,|\band\b|\bor\b)\s*", listed):
            ends = [e for e in re.split(r"\s*[-–]\s*", item) if e in order]
            if len(ends) == 2:
                named += order[order.index(ends[0]):order.index(ends[1]) + 1]
            else:
                named += ends
    return list(dict.fromkeys(named))


@dataclass(frozen=True)
class Quote:
    """A quoted span in a sentence citing the paper: where, its words, the sections the
    sentence names (of ``PASSAGES``), and whether the paper holds it there."""
    at: int
    words: str
    cited: tuple[str, ...]
    verbatim: bool


def paper_quotes(text: str) -> list[Quote]:
    """Every quoted span of at least three words in a sentence (or parenthesis) of
    ``text`` that cites the paper."""
    for pattern in CODE:
        text = _blank(pattern, text)
    quotes = list(QUOTED.finditer(text))
    # The sentences are cut with the quotes blanked (a quote's own full stops end nothing).
    hidden = text
    for m in quotes:
        hidden = hidden[:m.start()] + '"' + re.sub(r"[^\n]", "x", m.group(0)[1:-1]) + '"' \
            + hidden[m.end():]
    found = []
    for m in quotes:
        quote = m.group(1) or m.group(2)
        if len(quote.split()) < 3:
            continue
        lo, hi = _sentence(hidden, m.start(), m.end())
        spans = [_parenthesis(hidden, m.start(), m.end(), lo, hi), (lo, hi)]
        context = next((hidden[a:b] for a, b in filter(None, spans)
                        if CITE.search(hidden[a:b])), None)
        if context is None:
            continue
        cited = tuple(_sections(context))
        piece = _plain(quote)
        verbatim = any(piece in p for s in (cited or PASSAGES) for p in PASSAGES[s])
        found.append(Quote(m.start(), " ".join(quote.split()), cited, verbatim))
    return found


def quote_problems(text: str) -> list[tuple[int, str, str]]:
    """(offset, quote, why) for each quoted span of ``text`` that cites the paper and is
    not its words."""
    return [(q.at, q.words,
             f"not the paper's words ({'sec. ' + ', '.join(q.cited) if q.cited else 'any section'}"
             " of PAPER_WORDS): quote it exactly or write the paraphrase without quotation marks")
            for q in paper_quotes(text) if not q.verbatim]


def docstrings(source: str) -> list[tuple[int, str]]:
    """(first line, text) of the module's, classes' and functions' docstrings."""
    tree = ast.parse(source)
    found = []
    for node in [tree, *ast.walk(tree)]:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                found.append((body[0].lineno, body[0].value.value))
    return list(dict.fromkeys(found))


def check_text(name: str, text: str, first_line: int = 1) -> list[Finding]:
    return [Finding(name, first_line + text.count("\n", 0, at), quote, why)
            for at, quote, why in quote_problems(text)]


def prose_files(root: Path = ROOT) -> list[Path]:
    return ([root / "README.md", *sorted((root / "docs").glob("*.md"))]
            + sorted((root / "docs").rglob("*.py")) + sorted((root / "reference").rglob("*.py"))
            + sorted((root / "fast").rglob("*.py")))


def prose_texts(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of a file's prose: a markdown file whole, a module's docstrings."""
    text = path.read_text()
    return [(1, text)] if path.suffix == ".md" else docstrings(text)


def check_file(path: Path, root: Path = ROOT) -> list[Finding]:
    name = str(path.relative_to(root))
    return [f for line, text in prose_texts(path) for f in check_text(name, text, line)]


def main() -> int:
    findings = [f for path in prose_files() for f in check_file(path)]
    for f in findings:
        print(f)
    print(f"{len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
