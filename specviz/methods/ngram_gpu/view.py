"""ngram_gpu's view is prompt lookup's (:mod:`specviz.methods.ngram.view`): the device matcher reports the match it
used, and the view says what it leaves out (every occurrence, the continuation trie)."""

from specviz.methods.ngram.view import LESSON_FOCUS, draft_why, no_draft_why, note, panel_figure, panel_html  # noqa: F401
