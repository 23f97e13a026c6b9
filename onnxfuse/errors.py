"""The one error type users see: a message they can act on, printed as one line by the CLI."""

from __future__ import annotations

from collections.abc import Mapping


class OnnxfuseError(Exception):
    """An error caused by the user's input (model, pattern file, flag). Printed without a traceback.

    An error about one option value carries `option` (its name in the Python API, e.g. `measure_threads`) and
    `value`: the message then reads `measure_threads=0: must be >= 1` in the API, and the CLI shows the same
    error under its flag (`--threads 0: must be >= 1`, see `for_flags`). Messages never name CLI flags."""

    def __init__(self, message: str, hint: str | None = None, option: str | None = None,
                 value: object = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.option = option
        self.value = value

    def __str__(self) -> str:
        return self._text(None if self.option is None else _api_name(self.option, self.value))

    def for_flags(self, flags: Mapping[str, str]) -> str:
        """The one line the CLI prints: the option shown as its flag (`flags` maps API option names to flags)."""
        if self.option is None:
            return str(self)
        flag = flags.get(self.option)
        return self._text(_api_name(self.option, self.value) if flag is None else f"{flag} {_shown(self.value)}")

    def _text(self, where: str | None) -> str:
        head = f"{where}: {self.message}" if where else self.message
        return head + (f" (hint: {self.hint})" if self.hint else "")


def _shown(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return " ".join(value.split()) if isinstance(value, str) else str(value)


def _api_name(option: str, value: object) -> str:
    return f"{option}={value!r}"


class ModelError(OnnxfuseError):
    """The model file cannot be read, is malformed, or cannot be written."""


class PatternError(OnnxfuseError):
    """A pattern file is invalid. The message starts with file:line:col."""


class InputSpecError(OnnxfuseError):
    """--shape / --inputs do not fit the model."""


def write_error(e: BaseException, what: str, folder: str | None = None) -> OnnxfuseError:
    """One line for a temporary file that cannot be written (`what`: a candidate model, ...): no space left
    (ENOSPC, or a library's message saying so) names the folder it was going to: TMPDIR when `folder` is None
    or inside it."""
    import errno
    import os
    import tempfile

    reason = (e.strerror if isinstance(e, OSError) else None) or first_line(str(e))
    if (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "no space left" in str(e).lower():
        tmp = os.path.abspath(tempfile.gettempdir())
        inside = folder is None or os.path.commonpath([os.path.abspath(folder), tmp]) == tmp
        where = f"TMPDIR={tempfile.gettempdir()}" if inside else folder
        return OnnxfuseError(f"no space left in {where}: cannot write {what} ({reason})",
                             hint="free space there" + (", or set TMPDIR to a folder with more" if inside else ""))
    return OnnxfuseError(f"cannot write {what} to a temporary file ({reason})")


def first_line(text: str) -> str:
    """The first non-empty line of a message from another library (onnxruntime's run several lines)."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[0] if lines else "(no message)"
