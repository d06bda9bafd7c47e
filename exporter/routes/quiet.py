"""Keep exporters' console chatter out of exportgate's output while they run."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator

NOISY_LOGGERS = ("torch", "torch.onnx", "torch.export", "onnxscript", "tf2onnx", "tensorflow", "absl")


@contextlib.contextmanager
def quiet_exporter() -> Iterator[io.StringIO]:
    """Swallow stdout, warnings and the exporters' log records below ERROR; yields what was printed."""
    printed = io.StringIO()
    loggers = [logging.getLogger(name) for name in NOISY_LOGGERS]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(printed):
            warnings.simplefilter("ignore")
            yield printed
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
