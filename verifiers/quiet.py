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
    writes, log records, warnings) reaches stderr instead of being swallowed; stdout stays
    exportgate's own (a --json report goes there)."""
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
    framework output shown, descriptor 1 goes to descriptor 2 instead."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with contextlib.ExitStack() as stack:
            if _shown:
                os.dup2(saved[1], 1)
            else:
                scratch = stack.enter_context(tempfile.TemporaryFile())
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
    framework output shown (--verbose), all of it goes to stderr and nothing is yielded as printed."""
    printed = io.StringIO()
    if _shown:
        with contextlib.redirect_stdout(sys.stderr), native_output_captured():
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
