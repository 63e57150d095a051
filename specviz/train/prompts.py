"""Held-out evaluation prompts, cut from held-out corpus files at function boundaries.

A prompt is ``CONTEXT_LINES`` source lines before a function (its decorators included) followed by
the function's header, ending at the header's colon (no newline: the continuation starts with the
newline + indentation token, as in training). Candidates: every ``def`` / ``async def`` in a held-out
file (``ast.walk`` order) whose header spans at most ``MAX_HEADER_LINES`` lines and whose colon ends
its line (no one-line bodies, no trailing comment). The selection is fixed: candidates sorted by
``sha256(f"{relpath}:{def line}")``, the first ``n`` taken.
"""

from __future__ import annotations

import ast
import hashlib
import io
import tokenize
from dataclasses import dataclass

from specviz.train.corpus import SourceFile

CONTEXT_LINES = 24
MAX_HEADER_LINES = 8
DEFAULT_NUM_PROMPTS = 40


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt.

    relpath / def_line: where the function is (1-based line of ``def``).
    text:   context + header, ending with the header's ":".
    header: the header alone (from ``def`` to ":", original indentation), for the statement check.
    """

    relpath: str
    def_line: int
    text: str
    header: str


def header_end(lines: list[str], def_line: int) -> tuple[int, int] | None:
    """(row, col) of the colon ending the header that starts at 1-based ``def_line``, or None if
    tokenising fails. lines: the file's lines with line endings."""
    src = "".join(lines[def_line - 1 : def_line - 1 + MAX_HEADER_LINES + 1])
    depth = 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.OP and tok.string in "([{":
                depth += 1
            elif tok.type == tokenize.OP and tok.string in ")]}":
                depth -= 1
            elif tok.type == tokenize.OP and tok.string == ":" and depth == 0:
                return def_line + tok.start[0] - 1, tok.start[1]
    except (tokenize.TokenError, SyntaxError):
        return None
    return None


def function_prompts(f: SourceFile) -> list[Prompt]:
    """Every candidate prompt of one file (empty if the file does not parse)."""
    try:
        tree = ast.parse(f.text)
    except SyntaxError:
        return []
    lines = f.text.splitlines(keepends=True)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        end = header_end(lines, node.lineno)
        if end is None or end[0] - node.lineno >= MAX_HEADER_LINES:
            continue
        row, col = end
        if lines[row - 1][col + 1 :].strip():  # one-line body or trailing comment
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        context = "".join(lines[max(0, first - 1 - CONTEXT_LINES) : node.lineno - 1])
        header = "".join(lines[node.lineno - 1 : row - 1]) + lines[row - 1][: col + 1]
        out.append(Prompt(f.relpath, node.lineno, context + header, header))
    return out


def select_prompts(files: tuple[SourceFile, ...] | list[SourceFile], n: int = DEFAULT_NUM_PROMPTS) -> list[Prompt]:
    """The fixed selection: all candidates of ``files`` sorted by sha256("relpath:def_line"), first n."""
    cands = [p for f in files for p in function_prompts(f)]
    cands.sort(key=lambda p: hashlib.sha256(f"{p.relpath}:{p.def_line}".encode()).hexdigest())
    return cands[:n]
