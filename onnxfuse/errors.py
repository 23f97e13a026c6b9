"""The one error type users see: a message they can act on, printed as one line by the CLI."""

from __future__ import annotations


class OnnxfuseError(Exception):
    """An error caused by the user's input (model, pattern file, flag). Printed without a traceback."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message + (f" (hint: {self.hint})" if self.hint else "")


class ModelError(OnnxfuseError):
    """The model file cannot be read, is malformed, or cannot be written."""


class PatternError(OnnxfuseError):
    """A pattern file is invalid. The message starts with file:line:col."""


class InputSpecError(OnnxfuseError):
    """--shape / --inputs do not fit the model."""


def first_line(text: str) -> str:
    """The first non-empty line of a message from another library (onnxruntime's run several lines)."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[0] if lines else "(no message)"
