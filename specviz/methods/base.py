"""The method plugin contract: everything the engine, CLI, app, Compare, the lesson and the trainer know about one
speculative method, in one frozen :class:`Method`.

A method lives in its own folder, ``specviz/methods/<name>/``: ``__init__.py`` defines ``METHOD = Method(...)``
(no gradio / plotly / transformers at import), ``proposer.py`` its :class:`~specviz.proposer.Proposer`, ``view.py``
its "where the draft came from" view (plotly; loaded only by the figures), and, for a drafter with trained weights,
its head, loader and trainer. :mod:`specviz.methods` lists the built-in folders, one line each; a method from
elsewhere is added with :func:`specviz.methods.register`. Core code reads methods from the registry only.

The view module's contract (every name optional but ``panel_html`` and ``panel_figure``)::

    panel_html(trace, step: int, position: int | None) -> str   # the left panel (HTML)
    panel_figure(trace, step: int) -> plotly Figure                # the right panel
    note(trace) -> str                                             # a Markdown hint for the run summary
    draft_limit(trace) -> (n, short, full) | None                  # a chain method drafting fewer than k by design
    draft_why(trace, step) -> str | None                           # the lesson's "why these drafts" sentence(s)
    no_draft_why(trace, step) -> str | None                        # ... and when nothing was drafted
    LESSON_FOCUS = "match"                                         # the view the draft chapter highlights (default)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields
from typing import Any, Callable


def option(default: Any = None, *, label: str, help: str, lo: int | None = None, hi: int | None = None,
           ui: Any = None) -> Any:
    """A field of a method's options dataclass (its own generate() keywords): ``label`` and ``help`` for the CLI
    and the app, the app's slider range ``lo..hi`` and starting value ``ui`` (``default`` when None; ``default``
    None means the method resolves the value itself)."""
    return field(default=default, metadata={"label": label, "help": help, "lo": lo, "hi": hi,
                                            "ui": default if ui is None else ui})


def option_fields(options: type | None) -> tuple[Any, ...]:
    """The :func:`option` fields of an options dataclass (() for None)."""
    return tuple(fields(options)) if options is not None else ()


@dataclass(frozen=True)
class Texts:
    """What a method tells people, written for a student who knows sampling but not speculative decoding.

    source:     what drafted, for headings ("the EAGLE-3 head").
    how:        one paragraph: how it makes a draft (the "where the draft came from" section).
    lesson:     one line for the lesson's introduction ("method eagle3 (EAGLE-3: a small head ...)").
    confidence: what a tree node's confidence is ("head softmax"; the tree view's hover).
    """

    source: str
    how: str
    lesson: str
    confidence: str = "draft probability"


@dataclass(frozen=True)
class HeadSpec:
    """A drafter with its own trained weights, loaded onto the target.

    what:     "an EAGLE-3 head", for messages.
    load:     (directory, target model) -> the head on the target's device, attached to it; raises ValueError
              (saying what is wrong) for a directory it cannot load. None: :func:`specviz.heads.formats.load_head_dir`
              (specviz's format or a published layout, recognised from the files).
    bundled:  its directory under assets/models ("" = none bundled).
    describe: (head) -> the trace config's ``head`` entry beyond path and kind (its layout, taps, sizes).
    trainer:  "module:function" of its trainer (:mod:`specviz.train.heads` calls it), "" if it has none.
    module:   its head module, which defines ``SPECVIZ_FORMAT`` = (config class, build(config) -> head,
              check(config, target config)) for specviz's own format (:mod:`specviz.heads.io`), or ``load_own(directory,
              target, dtype)`` for a format of its own.
    formats:  its published layouts' module (:mod:`specviz.heads.formats`: ``LAYOUTS``, ``KIND_OF``, ``detect``,
              ``load``, ``write``), "" for none.
    eval_k:   the k of its held-out acceptance run when its natural k is not the recipe's (DFlash: block size - 1).
    eval_tree: a static tree its held-out acceptance run also tries ("" for none).
    max_drafts: (head) -> (the most tokens one chain step drafts with this head, why), or None for no limit: a k above
              it drafts that many, and the trace's ``draft_note`` says so (Medusa: one per head; DFlash: B - 1).
    """

    what: str
    load: Callable[[Any, Any], Any] | None = None
    bundled: str = ""
    describe: Callable[[Any], dict[str, Any]] = lambda head: {}
    trainer: str = ""
    module: str = ""
    formats: str = ""
    eval_k: int | None = None
    eval_tree: str = ""
    max_drafts: Callable[[Any], tuple[int, str]] | None = None


@dataclass(frozen=True)
class Method:
    """One speculative method (vLLM's ``--speculative-config method=`` name).

    name, summary:  vLLM's name; one line for help texts.
    make:           (:class:`Build`) -> the request's proposer, None for a method that drafts nothing.
    texts:          :class:`Texts`.
    style:          (colour, Plotly marker symbol) in the comparison's charts (None: one no built-in method uses).
    options:        a dataclass of its own generate() keywords (:func:`option` fields), or None.
    tree_forms:     the :data:`specviz.tree.TREE_FORMS` it drafts besides a chain.
    needs_draft:    it runs the decoder's draft model.
    head:           its trained weights (:class:`HeadSpec`), or None.
    request_state:  () -> state kept across requests (suffix's tree of earlier outputs): the app keeps one per
                    browser session, a comparison gives every run a fresh one, the Python API the decoder's own.
                    The state has ``snapshot()`` (a frozen copy: repeated timing runs draft from the same state and
                    change nothing) and ``clear()`` (the app's reset).
    state_note:     (state) -> a Markdown line about that state (the app shows it under the method).
    describe:       (config) -> extra trace config (resolved option values), or None.
    warm_up:        (:class:`~specviz.warmup.WarmUp`) -> graphs captured; pays its one-time costs before requests.
    view:           the module of its views (see the module docstring), imported by the figures only.
    details_schema: the keys its drafts record in ``Draft.details`` (the trace's ``step.match``) that its views
                    read, in :mod:`specviz.trace.validate`'s schema notation: an uploaded trace is checked against it.
    """

    name: str
    summary: str
    make: Callable[["Build"], Any]
    texts: Texts
    style: tuple[str, str] | None = None
    options: type | None = None
    tree_forms: tuple[str, ...] = ()
    needs_draft: bool = False
    head: HeadSpec | None = None
    request_state: Callable[[], Any] | None = None
    state_note: Callable[[Any], str] | None = None
    describe: Callable[[Any], dict[str, Any]] | None = None
    warm_up: Callable[[Any], int] | None = None
    view: str = ""
    details_schema: dict[str, Any] = field(default_factory=dict)

    def missing(self, decoder: Any) -> str | None:
        """Why ``decoder`` cannot run this method (what to pass), or None."""
        if self.needs_draft and decoder.draft_model is None:
            return (f"method {self.name!r} needs a draft model: pass draft=... to SpecDecoder.from_pretrained "
                    "(CLI and app: --draft DIR)")
        if self.head is not None and self.name not in decoder.heads:
            why = decoder.head_errors.get(self.name) or "no head was loaded"
            return (f"method {self.name!r} needs {self.head.what} for this target ({why}); pass "
                    f"heads={{'{self.name}': DIR}} to SpecDecoder.from_pretrained (CLI and app: --head "
                    f"{self.name}=DIR), or train one with `specviz train heads`")
        return None


@dataclass
class Build:
    """What a method's ``make`` gets for one request.

    decoder: the :class:`~specviz.engine.SpecDecoder` (``device``, ``vocab_size``, ``draft_model``, ``heads``,
             ``runner_options``, ``pool``). config: the request's :class:`~specviz.config.GenerationConfig`.
    state:   the caller's request state (see ``Method.request_state``), or None.
    Objects taken with :meth:`lease` go back to the decoder's pool when the request ends, exactly once; callbacks
    given to :meth:`on_finish` get the request's output ids then (before the leases return).
    """

    decoder: Any
    config: Any
    state: Any = None
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    finishers: list[Callable[[list[int]], None]] = field(default_factory=list)

    @property
    def options(self) -> Any:
        return self.config.options

    def lease(self, key: Any, make: Callable[[], Any]) -> Any:
        """A pooled object for ``key`` (made by ``make`` when none is free), returned to the pool at the end."""
        return self.stack.enter_context(self.decoder.pool.lease(key, make))

    def on_finish(self, callback: Callable[[list[int]], None]) -> None:
        self.finishers.append(callback)

    def finish(self, generated: list[int]) -> None:
        """Run the finish callbacks, then return every lease (both exactly once, also after an error)."""
        try:
            for callback in self.finishers:
                callback(list(generated))
        finally:
            self.finishers.clear()
            self.stack.close()
