"""Keep exporters' console chatter out of exportgate's output while they run."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator

NOISY_LOGGERS = ("torch", "torch.onnx", "torch.export", "onnxscript", "tf2onnx", "tensorflow", "absl")


@contextlib.contextmanager
def native_output_captured() -> Iterator[None]:
    """Send what native code writes to file descriptors 1 and 2 to a scratch file: the TorchScript
    exporter dumps whole graphs there on failure, TensorFlow and LiteRT their start-up logs."""
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
    """Swallow stdout, native output, warnings and the exporters' log records below ERROR; yields
    what Python code printed."""
    printed = io.StringIO()
    loggers = [logging.getLogger(name) for name in NOISY_LOGGERS]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(printed), native_output_captured():
            warnings.simplefilter("ignore")
            yield printed
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
