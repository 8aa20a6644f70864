"""A quote of the paper in README.md, docs/*.md or a docstring is its exact words
(``tests/paper_quotes.py``).

Child et al., 2019 (sec. 4-7) is quoted across the project; the house rule is that a
quote is the paper's exact words with its section, a paraphrase has no quotation marks.
The checker reads the files (nothing imported). Each rule is shown to fire on a small
text, and every verbatim quote of the real prose, one word changed, is shown caught.
"""

from __future__ import annotations

import pytest

from tests.notebooks.notebook_prose import PAPER_HEADINGS, PAPER_SECTIONS
from tests.paper_quotes import (
    check_file,
    docstrings,
    paper_quotes,
    prose_files,
    prose_texts,
    quote_problems,
)

FILES = prose_files()


def test_every_quote_of_the_paper_in_the_prose_is_its_words():
    findings = [f for path in FILES for f in check_file(path)]
    print(len(FILES), "files")
    assert not findings, "\n" + "\n".join(map(str, findings))


def test_the_headings_name_the_papers_sections():
    assert set(PAPER_HEADINGS) == PAPER_SECTIONS | {""}


@pytest.mark.parametrize("text, flagged", [
    # the words docs/design.md once gave as the paper's (sec. 5.5)
    ('The paper: "a stride-l pattern is computed by transposing the sequence into an (n/l, l) '
     'grid and running a local window; softmax is fused". Two follow it.', True),
    ('Child et al., 2019, sec. 5.5 ("fixed positions are gathered and computed in blocks").',
     True),
    ('sec. 5.5: “softmax is fused into one kernel”, curly quotes.', True),
    ('sec. 5.5: "Fixed attention positions can be aggregated and computed in blocks".', False),
    ('sec. 5.5 ("The softmax operation is fused into a single kernel", "The upper triangle '
     'of the attention matrix is never computed").', False),
    ('sec. 4.3 and 5.5 ("Fixed attention positions can be aggregated and computed in '
     'blocks").', False),
    ('sections 5.2-5.6 say "Fixed attention positions can be aggregated".', False),
    # the right words under the wrong section
    ('sec. 4.3: "Fixed attention positions can be aggregated and computed in blocks".', True),
    # math written as text matches the LaTeX of PAPER_WORDS
    ('sec. 4.3: "attend to the previous l locations".', False),
    ('sec. 7.1: "half-size query-key projections"', True),
    ('sec. 7.1: "half-size feedforward network and query-key projections"', False),
    # the title and the sections' headings
    ('Child et al., 2019, "Generating Long Sequences with Sparse Transformers", sec. 4.3.',
     False),
    ('sec. 5.5 ("Efficient block-sparse attention kernels")', False),
    ('sec. 5.4 ("Efficient block-sparse attention kernels")', True),
    # not a quote of the paper: no citation, fewer than three words, code
    ('the network widens by "two times its width" here.', False),
    ('sec. 6: the "half-size" network and "last c" positions.', False),
    ('sec. 5.5: ``"not the paper at all"`` and `"nor this one"`.', False),
    ('docs/design.md (§5, "Where the time goes on the CPU") measures it.', False),
    # the citation is in the quote's sentence or parenthesis, not the next one
    ('It is "not the paper at all". Sec. 5.5 says more.', False),
    ('Sec. 5.5 says more. It is "not the paper at all".', False),
    ('Sec. 5.5 says more (and "not the paper at all").', True),
])
def test_a_quote_that_cites_the_paper_is_its_words(text, flagged):
    found = quote_problems(text)
    print(text, "->", found)
    assert bool(found) == flagged


def test_the_docstrings_of_modules_classes_and_functions_are_read():
    source = ('"""Module, sec. 5.5: "softmax is fused in one"."""\n'
              'class A:\n    """Class, sec. 5.5: "softmax is fused in two"."""\n'
              '    def f(self):\n        """Function, sec. 5.5: "softmax is fused in three"."""\n'
              '        # comment, sec. 5.5: "softmax is fused in four"\n'
              '        return "sec. 5.5: softmax is fused in five"\n')
    found = [q.words for _, doc in docstrings(source) for q in paper_quotes(doc)]
    assert found == [f"softmax is fused in {n}" for n in ("one", "two", "three")]


def test_every_quote_of_the_real_prose_with_a_word_changed_is_caught():
    checked = 0
    for path in FILES:
        for _, text in prose_texts(path):
            for quote in paper_quotes(text):
                assert quote.verbatim, (path, quote)
                words = quote.words.split()
                i = max(range(len(words)), key=lambda k: len(words[k]))  # its longest word
                changed = " ".join(words[:i] + ["zebra"] + words[i + 1:])
                original = text[quote.at:].split('"', 2)[1] if text[quote.at] == '"' \
                    else text[quote.at:].split("”", 1)[0][1:]
                mutated = text[:quote.at + 1] + changed + text[quote.at + 1 + len(original):]
                assert any(q.words == changed and not q.verbatim
                           for q in paper_quotes(mutated)), (path, quote.words)
                checked += 1
    print(checked, "quotes of the paper, each caught with one word changed")
    assert checked >= 20
