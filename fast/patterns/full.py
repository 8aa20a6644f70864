"""Full causal attention: output i reads every position j <= i.

Child et al., 2019, sec. 4 (eq. 2-4, S_i = {j : j <= i}) and Figure 3a: the dense
baseline of every comparison. One part, "full", read by every head in every combine mode.
No parameters. Its reference twin: ``reference.patterns.full``.
"""

from __future__ import annotations

from fast.patterns.pattern import Pattern, Periodic, Term, every


def parts(n, device):
    return {"full": (Term(every, Periodic()),)}


PATTERN = Pattern("full", parts, cite="Child et al., 2019, sec. 4, Figure 3a")
