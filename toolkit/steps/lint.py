"""Step `lint`: what the target would reject in the FP32 model, each finding naming its node; the first error
stops the build (`tapeout lint` lists them all)."""

from __future__ import annotations

from tapeout.steps.export import lint_or_raise
from tapeout.steps.state import BuildState
from tapeout.steps.step import Step


class Lint(Step):
    name = "lint"
    needs = ("exported",)
    adds = ("lint",)

    def run(self, state: BuildState) -> str | None:
        if state.exported.lint is not None:  # an ONNX source, linted before it was copied
            state.lint = state.exported.lint
            return "the ONNX source was linted before it was copied"
        with state.ui.step(f"lint for {state.setup.profile.target}"):
            state.lint = lint_or_raise(state, state.exported.path)
        return None

    def report(self, state: BuildState) -> dict[str, object]:
        return {"lint": [i.line() for i in state.lint]}
