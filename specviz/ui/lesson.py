"""Lesson mode controls: Lesson / Back / Play / Next, jump to a step, the chapter panel, and the
presentation layout's switch. The chapters are :mod:`specviz.viz.lesson` (pure functions of the
trace); these handlers only move an index and select the chapter's step and position in the
existing views.

Events (api names, besides ``lesson_reset`` when a run or upload ends the lesson): ``lesson_start``, ``lesson_next``, ``lesson_back``, ``lesson_goto`` (a step
index), ``lesson_play`` (toggles Play), ``lesson_tick`` (Play's timer: the next chapter, pausing at
the last), ``lesson_brief`` (the "brief" box: steps after the first two in one chapter each; ticked from the start
in the presentation layout), ``lesson_every`` (the "every position" box: greedy verification's accepted positions a
chapter each instead of one chapter per step for them). Keyboard while
a lesson runs: right arrow = Next, left arrow = Back, space = Play/Pause (ignored while typing in a field;
"jump to step" + Enter gives the focus back to the page, so the arrows move the lesson again). The
presentation layout (large type, Run and the chapter above
the fold) is on with ``?present=1`` in the URL or ``build_app(present=True)`` (``app.py --present``).
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from specviz.trace import Trace
from specviz.viz.lesson import BRIEF_FULL_STEPS, chapter_html, chapter_of_step, lesson_chapters

from .lesson_script import LESSON_JS, PRESENT_FONT_SCALE  # noqa: F401 (PRESENT_FONT_SCALE re-exported)
from .widgets import LenientNumber
from .outputs import number as _number, sliders as _sliders, trace_of as _trace_of
from .views import selection_views

PLAY_SECONDS = 6.0  # Play shows the next chapter after this many seconds
IDLE = ("<div class='sv-lesson-idle'{present}>Lesson mode: after a run (or an uploaded trace), press "
        "<b>Lesson</b> to walk through it chapter by chapter: Next / Back (→ / ←), Play (space), or jump to a step."
        "</div>")
NO_TRACE = "<div class='sv-lesson-idle'>There is no run to explain yet: press Run (or upload a trace), then Lesson.</div>"
RUNNING = ("<div class='sv-lesson-idle'>The run is still going ({steps} steps so far): start the lesson when it has "
           "finished, or press Stop to teach the steps it has made.</div>")


def _not_ready(state: dict[str, Any] | None, trace: Any) -> str | None:
    """Why there is nothing to teach yet: no trace, or the session's run still streaming into ``state`` (its
    ``live`` flag: the chapters would change under the lecturer); None otherwise (an upload, a finished or stopped
    run)."""
    if trace is None or not trace.steps:
        return NO_TRACE
    return RUNNING.format(steps=len(trace.steps)) if (state or {}).get("live") else None


def new_lesson(full_steps: int | None = None, every_position: bool = False) -> dict[str, Any]:
    """A lesson's session state: the chapter shown (-1: none), whether Play is on, how many steps are told
    in full (None: all; the "brief" box sets :data:`~specviz.viz.lesson.BRIEF_FULL_STEPS`) and whether greedy
    verification's accepted positions get a chapter each (the "every position" box)."""
    return {"index": -1, "playing": False, "full_steps": full_steps, "every_position": every_position}


def _chapters(trace: Trace, lesson: dict[str, Any] | None) -> list:
    lesson = lesson or {}
    return lesson_chapters(trace, lesson.get("full_steps"), bool(lesson.get("every_position")))


def lesson_panel(present: bool = False) -> dict[str, Any]:
    """The lesson bar and chapter panel (call inside the Blocks, where it should appear); ``present``: the
    presentation layout, where the lesson is brief from the start."""
    c: dict[str, Any] = {}
    with gr.Group(elem_id="sv-lesson"):
        with gr.Row(elem_id="sv-lesson-bar", equal_height=True):
            c["start"] = gr.Button("Lesson", variant="primary", elem_id="sv-lesson-start", scale=0, min_width=110)
            c["back"] = gr.Button("◀ Back", elem_id="sv-lesson-back", scale=0, min_width=110)
            c["play"] = gr.Button("Play", elem_id="sv-lesson-play", scale=0, min_width=110)
            c["next"] = gr.Button("Next ▶", elem_id="sv-lesson-next", scale=0, min_width=110)
            # lenient: a step out of range (-1, say) is clamped by lesson_goto, not refused with error toasts
            c["goto"] = LenientNumber(None, label="jump to step", precision=0, minimum=0, elem_id="sv-lesson-goto",
                                      scale=0, min_width=120)
            c["brief"] = gr.Checkbox(present, label=f"brief: after step {BRIEF_FULL_STEPS - 1}, one chapter a step",
                                     elem_id="sv-lesson-brief", scale=0, min_width=180)
            c["every"] = gr.Checkbox(False, label="every position: a chapter per accepted greedy token",
                                     elem_id="sv-lesson-every", scale=0, min_width=180)
        c["text"] = gr.HTML(IDLE.format(present=" data-present='1'" if present else ""), elem_id="sv-lesson-text",
                            js_on_load=LESSON_JS)
    c["timer"] = gr.Timer(PLAY_SECONDS, active=False)
    c["state"] = gr.State(new_lesson(BRIEF_FULL_STEPS if present else None))
    return c


def _show(trace: Trace, lesson: dict[str, Any], index: int) -> tuple[Any, ...]:
    """(chapter html, lesson state, step slider, position slider, stream, grid, residual, match,
    trie) for chapter ``index`` (clamped). A chapter about the whole run (statistics) leaves the
    sliders and the selection views as they are."""
    chapters = _chapters(trace, lesson)
    n = min(max(int(index), 0), len(chapters) - 1)
    ch = chapters[n]
    lesson = {**lesson, "index": n}
    if ch.step is None or not trace.steps:
        return (chapter_html(chapters, n), lesson, *([gr.skip()] * 7))
    position = ch.position if ch.position is not None else trace.steps[ch.step].num_accepted + 1
    views = selection_views(trace, ch.step, position)
    return (chapter_html(chapters, n), lesson, *_sliders(trace, ch.step, position), *views)


def _skip(message: str, lesson: dict[str, Any] | None) -> tuple[Any, ...]:
    return (message, {**new_lesson(), **(lesson or {}), "index": -1}, *([gr.skip()] * 7))


def lesson_start(state: dict[str, Any] | None, lesson: dict[str, Any] | None) -> tuple[Any, ...]:
    """Lesson: the first chapter of the session's trace (a message when there is none)."""
    trace = _trace_of(state)
    if why := _not_ready(state, trace):
        return _skip(why, lesson)
    return _show(trace, lesson or new_lesson(), 0)


def _move(state: dict[str, Any] | None, lesson: dict[str, Any] | None, delta: int) -> tuple[Any, ...]:
    trace = _trace_of(state)
    if why := _not_ready(state, trace):
        return _skip(why, lesson)
    lesson = lesson or new_lesson()
    return _show(trace, lesson, max(int(lesson.get("index", -1)), 0 if delta > 0 else 1) + delta)


def lesson_next(state: dict[str, Any] | None, lesson: dict[str, Any] | None) -> tuple[Any, ...]:
    """Next: the following chapter (stays on the last one; starts the lesson if none is shown)."""
    if (lesson or {}).get("index", -1) < 0:
        return lesson_start(state, lesson)
    return _move(state, lesson, +1)


def lesson_back(state: dict[str, Any] | None, lesson: dict[str, Any] | None) -> tuple[Any, ...]:
    """Back: the previous chapter (stays on the first)."""
    return _move(state, lesson, -1)


def lesson_goto(state: dict[str, Any] | None, lesson: dict[str, Any] | None, step: Any) -> tuple[Any, ...]:
    """Jump to step: the first chapter of that step (clamped to the run's steps)."""
    trace = _trace_of(state)
    if why := _not_ready(state, trace):
        return _skip(why, lesson)
    chapters = _chapters(trace, lesson)
    return _show(trace, lesson or new_lesson(), chapter_of_step(chapters, int(_number(step, 0))))


def lesson_play(lesson: dict[str, Any] | None) -> tuple[Any, ...]:
    """Play / Pause: (timer, button, lesson state); Play advances every PLAY_SECONDS."""
    playing = not (lesson or {}).get("playing", False)
    return (gr.Timer(active=playing), gr.Button("Pause" if playing else "Play"),
            {**new_lesson(), **(lesson or {}), "playing": playing})


def lesson_tick(state: dict[str, Any] | None, lesson: dict[str, Any] | None) -> tuple[Any, ...]:
    """Play's timer: the next chapter; at the last chapter (or without a trace) Play pauses.
    Returns :func:`lesson_next`'s outputs, then the timer and the Play button."""
    trace = _trace_of(state)
    lesson = lesson or new_lesson()
    out = lesson_next(state, lesson)
    count = 0 if _not_ready(state, trace) else len(_chapters(trace, lesson))
    if out[1]["index"] < 0 or out[1]["index"] >= count - 1:
        return (*out[:1], {**out[1], "playing": False}, *out[2:], gr.Timer(active=False), gr.Button("Play"))
    return (*out, gr.skip(), gr.skip())


def _reform(state: dict[str, Any] | None, lesson: dict[str, Any] | None, **setting: Any) -> tuple[Any, ...]:
    """The lesson with ``setting`` changed (keys of :func:`new_lesson`). A lesson being shown stays where it was in the
    new form (the first chapter of the step it was on; the introduction and the closing statistics stay themselves);
    otherwise only the setting is kept."""
    old = {**new_lesson(), **(lesson or {})}
    lesson = {**old, **setting}
    trace = _trace_of(state)
    if lesson["index"] < 0 or _not_ready(state, trace):
        return (gr.skip(), lesson, *([gr.skip()] * 7))
    before, after = _chapters(trace, old), _chapters(trace, lesson)
    here = before[min(int(old["index"]), len(before) - 1)]
    if here.step is not None and here.kind != "intro":
        index = chapter_of_step(after, here.step)
    else:  # the introduction (first) or the statistics (last)
        index = 0 if int(old["index"]) == 0 else len(after) - 1
    return _show(trace, lesson, index)


def lesson_brief(state: dict[str, Any] | None, lesson: dict[str, Any] | None, brief: Any) -> tuple[Any, ...]:
    """The "brief" box: tell only the first BRIEF_FULL_STEPS steps in full, every later one in one chapter
    (:func:`_reform`)."""
    return _reform(state, lesson, full_steps=BRIEF_FULL_STEPS if brief else None)


def lesson_every(state: dict[str, Any] | None, lesson: dict[str, Any] | None, every: Any) -> tuple[Any, ...]:
    """The "every position" box: greedy verification's accepted positions a chapter each (:func:`_reform`)."""
    return _reform(state, lesson, every_position=bool(every))


def lesson_reset(lesson: dict[str, Any] | None) -> tuple[Any, ...]:
    """A new run or upload ends the lesson: (idle panel, lesson state, timer off, Play button); the brief and every
    position settings stay."""
    lesson = lesson or {}
    return (IDLE.format(present=""), new_lesson(lesson.get("full_steps"), bool(lesson.get("every_position"))),
            gr.Timer(active=False), gr.Button("Play"))


def wire_lesson(c: dict[str, Any], state: gr.State, views: dict[str, Any], resets: list[Any] = ()) -> None:
    """Connect the lesson controls ``c`` (from :func:`lesson_panel`) to the session ``state``
    and the views (``views`` holds step, position, stream, grid, residual, match, trie);
    ``resets``: event triggers (e.g. ``run_button.click``) that end a running lesson."""
    outs = [c["text"], c["state"], views["step"], views["position"],
            *(views[n] for n in ("stream", "grid", "residual", "match", "trie"))]
    common = {"concurrency_id": "selection", "trigger_mode": "always_last"}
    c["start"].click(lesson_start, [state, c["state"]], outs, api_name="lesson_start", **common)
    c["next"].click(lesson_next, [state, c["state"]], outs, api_name="lesson_next", **common)
    c["back"].click(lesson_back, [state, c["state"]], outs, api_name="lesson_back", **common)
    c["goto"].submit(lesson_goto, [state, c["state"], c["goto"]], outs, api_name="lesson_goto", **common)
    c["brief"].change(lesson_brief, [state, c["state"], c["brief"]], outs, api_name="lesson_brief", **common)
    c["every"].change(lesson_every, [state, c["state"], c["every"]], outs, api_name="lesson_every", **common)
    c["play"].click(lesson_play, [c["state"]], [c["timer"], c["play"], c["state"]], api_name="lesson_play")
    if resets:
        gr.on(list(resets), lesson_reset, [c["state"]], [c["text"], c["state"], c["timer"], c["play"]],
              api_name="lesson_reset")
    c["timer"].tick(lesson_tick, [state, c["state"]], [*outs, c["timer"], c["play"]], api_name="lesson_tick",
                    **common)
