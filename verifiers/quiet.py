"""Keep exporters' console chatter out of exportgate's output while they run, unless asked to let
it through (`exportgate --verbose`)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator

_shown = False  # set by show_framework_output(): what the frameworks print and log reaches stderr


def show_framework_output() -> None:
    """From now on in this process, what the frameworks print and log while they export (native
    writes, log records, warnings) is let through instead of being swallowed (the CLI keeps
    stdout for its report by sending descriptor 1 and Python's stdout to stderr)."""
    global _shown
    _shown = True


def hide_framework_logs() -> None:
    """Log records below ERROR stay off the terminal for the rest of the process, whatever level
    a framework sets its loggers to (torch re-initialises its own when torch.export starts)."""
    logging.disable(logging.WARNING)


@contextlib.contextmanager
def native_output_captured() -> Iterator[None]:
    """Send what native code writes to file descriptors 1 and 2 to a scratch file: the TorchScript
    exporter dumps whole graphs there on failure, TensorFlow and LiteRT their start-up logs. With
    framework output shown it goes where it would."""
    if _shown:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with tempfile.TemporaryFile() as scratch:
            os.dup2(scratch.fileno(), 1)
            os.dup2(scratch.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        for fd in saved:
            os.close(fd)


@contextlib.contextmanager
def quiet_exporter() -> Iterator[io.StringIO]:
    """Swallow stdout, native output, warnings and log records below ERROR (any logger's: an
    exporter may reset its loggers' levels while it runs); yields what Python code printed. With
    framework output shown (--verbose), all of it goes where it would and nothing is yielded as printed."""
    printed = io.StringIO()
    if _shown:
        yield printed
        return
    disabled = logging.root.manager.disable
    try:
        logging.disable(max(disabled, logging.WARNING))
        with warnings.catch_warnings(), contextlib.redirect_stdout(printed), native_output_captured():
            warnings.simplefilter("ignore")
            yield printed
    finally:
        logging.disable(disabled)
