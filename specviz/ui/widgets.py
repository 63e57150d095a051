"""Input widgets whose out-of-range values reach the handlers, which clamp or explain them (the layout and the lesson
panel both use them)."""

from __future__ import annotations

import gradio as gr


class LenientSlider(gr.Slider):
    """A gr.Slider whose typed-in value reaches the handler even when it is out of range: Gradio's
    own bound check raises an error that marks every output of the event with an "Error" badge.
    The handlers check or clamp the value instead (run: the same message in the progress line;
    step / position: clamped to the trace)."""

    def get_block_name(self) -> str:
        return "slider"

    def preprocess(self, payload: float) -> float:
        return gr.Number.round_to_precision(payload, self.precision)


class LenientNumber(gr.Number):
    """A gr.Number whose out-of-range value reaches the handler (see :class:`LenientSlider`): the
    run handler validates it and says what to change in the progress line, instead of Gradio's
    bound check marking every output with an "Error" badge."""

    def get_block_name(self) -> str:
        return "number"

    def preprocess(self, payload: float | None) -> float | int | None:
        return None if payload is None else self.round_to_precision(payload, self.precision)
