"""Tests against real older runtimes, each in a venv of its own (runtime_venvs.py beside this file)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
