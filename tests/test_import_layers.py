"""specviz/kernels/ and the rest of specviz do not import each other in a circle: what a kernel module imports from
specviz at module level (the shared contracts: result types, argument checks, synthetic rates) never imports
specviz.kernels, not even lazily inside a function (specviz reaches the kernels lazily, by backend)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path, top_level_only: bool) -> set[str]:
    """Module names imported by ``path`` (module level only, or anywhere in the file)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_kernels_import_only_specviz_modules_that_never_import_kernels():
    shared = set()
    for path in sorted((ROOT / "specviz" / "kernels").glob("*.py")):
        shared |= {m for m in _imports(path, top_level_only=True)
                   if m.startswith("specviz") and not m.startswith("specviz.kernels")}
    assert "specviz.sampling.rates" in shared and "specviz.methods.ngram.match" in shared
    for module in sorted(shared):
        path = ROOT / (module.replace(".", "/") + ".py")
        assert path.exists(), module
        back = {m for m in _imports(path, top_level_only=False) if m.startswith("specviz.kernels")}
        assert not back, f"{module} imports {back}, and specviz/kernels/ imports {module}: an import circle"


def test_shared_helpers_are_the_ones_both_sides_use():
    from specviz.methods.ngram import match as ngram_match
    from specviz.methods.ngram_gpu import proposer as ngram_gpu
    from specviz.sampling import rates, reference

    assert reference._conditional_rates is rates.conditional_rates
    assert ngram_gpu.ngram_match_reference is ngram_match.ngram_match_reference
    assert ngram_gpu.NgramMatch is ngram_match.NgramMatch
