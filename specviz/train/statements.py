"""Does a continuation of a function header start with a syntactically valid statement?

Definition (used in the model card). Given a function ``header`` (from ``def`` to its ":", with its
original indentation) and a generated ``continuation``, the *first complete statement* is found by
running Python's ``tokenize`` over ``header + continuation``:

0. Lines are first dedented by the header's indentation (at most that many leading spaces
   each), so that the header sits at column 0.
1. After the header's NEWLINE, the next significant token must be an INDENT (the body); otherwise
   the result is ``"no_body"``.
2. The statement starts on that line and ends with its logical line (the NEWLINE token at body
   depth). If that logical line is followed by a deeper INDENT (a compound statement: ``if``,
   ``for``, ``with``, ``def``, ...), it extends to the end of that block and through any following
   ``else`` / ``elif`` / ``except`` / ``finally`` clauses. A decorator line extends to the
   definition it decorates.
3. Completeness (so that ``max_new_tokens`` cutting a statement short is not scored as a syntax
   error): a simple statement is complete once the newline ending its logical line is in the
   continuation; a compound statement once a later line at the body's indentation or less, that
   is not one of its clauses, is in the continuation. If the model ended the text with
   <|endoftext|> (``ended=True``), the end of the text completes it too. A statement that is not
   complete is ``"incomplete"``.
4. A complete statement *parses* if ``ast.parse("if True:\\n" + its source lines)`` succeeds
   (``"parsed"``), else ``"syntax_error"``. A tokenize error (bad dedent, unterminated string
   before the end) before the statement is complete is ``"syntax_error"``; running out of text
   inside a bracket or string is ``"incomplete"`` (``"syntax_error"`` if ``ended``).
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass

CLAUSES = {"else", "elif", "except", "finally"}
SKIP = (tokenize.NL, tokenize.COMMENT, tokenize.DEDENT)


@dataclass(frozen=True)
class StatementCheck:
    """status: "parsed" | "syntax_error" | "incomplete" | "no_body"; text: the statement's source
    lines ("" when none was delimited)."""

    status: str
    text: str = ""


def first_statement(header: str, continuation: str, ended: bool = False) -> StatementCheck:
    """Classify the first complete statement of ``continuation`` (see module docstring).

    header: "def f(...):" possibly indented / multi-line, no trailing newline. ended: the model
    emitted <|endoftext|> right after ``continuation``."""
    src = _dedent(header + continuation, len(header) - len(header.lstrip(" ")))
    toks, error = _tokens(src)
    span = _statement_span(toks, ended)
    if span is None:  # ran out of tokens before the statement was delimited
        if error is None or (isinstance(error, tokenize.TokenError) and not ended):
            return StatementCheck("syntax_error" if ended and error is None else "incomplete")
        return StatementCheck("syntax_error")
    if isinstance(span, str):
        return StatementCheck(span)
    text = "".join(src.splitlines(keepends=True)[span[0] - 1 : span[1]])
    try:
        ast.parse("if True:\n" + text)
    except (SyntaxError, ValueError):
        return StatementCheck("syntax_error", text)
    return StatementCheck("parsed", text)


def _dedent(src: str, width: int) -> str:
    """Remove up to ``width`` leading spaces from every line, so that the header sits at column 0
    and a line less indented than the header (the enclosing block going on) is a plain dedent."""
    lines = src.splitlines(keepends=True)
    return "".join(line[min(width, len(line) - len(line.lstrip(" "))) :] for line in lines)


def _tokens(src: str) -> tuple[list[tokenize.TokenInfo], Exception | None]:
    """All tokens up to the first tokenize error, and that error (None if none)."""
    out: list[tokenize.TokenInfo] = []
    try:
        for t in tokenize.generate_tokens(io.StringIO(src).readline):
            out.append(t)
    except (tokenize.TokenError, SyntaxError) as exc:  # IndentationError is a SyntaxError
        return out, exc
    return out, None


def _statement_span(toks: list, ended: bool) -> tuple[int, int] | str | None:
    """(first row, last row), 1-based, of the first body statement; "no_body" / "incomplete";
    or None if the tokens ran out first."""
    depth, i = 0, 0
    while i < len(toks) and toks[i].type != tokenize.NEWLINE:  # the header's logical line
        depth += _depth_change(toks[i])
        i += 1
    body, j = depth + 1, _next(toks, i, skip=(tokenize.NL, tokenize.COMMENT))
    if j is None:
        return None
    k = _next(toks, i)  # DEDENT skipped: the text may end right after the header
    if k is not None and toks[k].type == tokenize.ENDMARKER and not ended:
        return "incomplete"
    if toks[j].type != tokenize.INDENT:
        return "no_body"
    start, depth, first, end = toks[j].start[0], body, j + 1, None
    for i in range(j + 1, len(toks)):
        t = toks[i]
        depth += _depth_change(t)
        if t.type == tokenize.NEWLINE and depth == body:
            end = t.start[0]
            nxt = _next(toks, i)
            if toks[first].string == "@":  # a decorator: go on to what it decorates
                first = nxt if nxt is not None else first
            elif nxt is not None and toks[nxt].type == tokenize.INDENT:
                continue  # a compound statement's block follows
            elif t.string or ended:  # a simple statement ended by a real newline
                return start, end
            else:
                return "incomplete"
        elif t.type == tokenize.NEWLINE:
            end = t.start[0]
        elif t.type == tokenize.DEDENT and depth == body and end is not None:
            nxt = _next(toks, i)
            if nxt is None:
                return None
            at_body = toks[i + 1].type != tokenize.DEDENT  # else the function body ends here too
            if at_body and toks[nxt].type == tokenize.NAME and toks[nxt].string in CLAUSES:
                first = nxt
            elif toks[nxt].type != tokenize.ENDMARKER or ended:
                return start, end
            else:
                return "incomplete"
    return None


def _depth_change(t) -> int:
    return 1 if t.type == tokenize.INDENT else -1 if t.type == tokenize.DEDENT else 0


def _next(toks: list, i: int, skip=SKIP) -> int | None:
    """Index of the first token after i whose type is not in skip, or None."""
    for j in range(i + 1, len(toks)):
        if toks[j].type not in skip:
            return j
    return None
