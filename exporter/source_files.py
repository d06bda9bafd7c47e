"""The files a source model was built from: the modules of the user's own code it imported and the
files it opened for reading while it loaded (its weights, a config), outside the Python
installation. The report lists them with their SHA-256; a pipeline's cache reuses a result only
while they are unchanged.

Files are seen through Python's audit hooks ("open", PEP 578) and the modules the load added to
sys.modules. A file read by native code that bypasses Python's open (a Rust or C++ loader
memory-mapping it) is not seen: a pipeline names such files in its config (`files`).
"""

from __future__ import annotations

import contextlib
import os
import site
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

_recording: list[set[str]] = []  # the open recordings; the hook adds to each
_hook_lock = threading.Lock()
_hook_added = False
_WRITE_MODES = set("wax+")
_SYSTEM_FOLDERS = ("/proc/", "/sys/", "/dev/")
_DISPLAY_MODULES = {"linecache", "tokenize"}  # they read source files to print lines of them


def _on_audit(event: str, args: tuple) -> None:
    if event != "open" or not _recording:
        return
    path, mode, flags = (tuple(args) + (None, None, None))[:3]
    if not isinstance(path, (str, bytes, os.PathLike)):
        return  # a file descriptor
    if isinstance(mode, str) and _WRITE_MODES & set(mode):
        return
    if isinstance(flags, int) and flags & os.O_ACCMODE != os.O_RDONLY:
        return
    if _opened_for_display(sys._getframe(1)):
        return
    name = os.fsdecode(path)
    for files in _recording:
        files.add(name)


def _opened_for_display(frame) -> bool:
    """Whether a file is read to show its lines (a warning's or a traceback's source line)."""
    for _ in range(3):
        if frame is None:
            return False
        if frame.f_globals.get("__name__") in _DISPLAY_MODULES:
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def recording() -> Iterator[list[Path]]:
    """Record what the block imports and reads; the list yielded is filled when the block ends
    (also when it raises): the user's files, resolved, sorted, each once."""
    global _hook_added
    with _hook_lock:
        if not _hook_added:
            sys.addaudithook(_on_audit)  # for the process's life: it does nothing while nothing records
            _hook_added = True
    opened: set[str] = set()
    before = set(sys.modules)
    _recording.append(opened)
    found: list[Path] = []
    try:
        yield found
    finally:
        _recording.remove(opened)
        modules = [getattr(sys.modules.get(name), "__file__", None) for name in set(sys.modules) - before]
        found.extend(_user_files(opened | {m for m in modules if m}))


def _user_files(names: set[str]) -> list[Path]:
    """The names outside the installation, resolved. A name under an installation folder as written
    is not resolved (a load imports thousands of installed modules; a link from there to the user's
    code would be read as installed)."""
    skipped = _SYSTEM_FOLDERS + _installation_folders()
    folders: dict[str, str] = {}  # a folder's real path, resolved once for all the files in it
    files = set()
    for name in names:
        if os.path.abspath(name).startswith(skipped):
            continue
        text = _real_path(name, folders)
        if text.startswith(skipped) or text.endswith(".pyc"):  # .pyc: a module's bytecode, its source is recorded
            continue
        with contextlib.suppress(OSError):
            if os.path.isfile(text):
                files.add(Path(text))
    return sorted(files)


def _real_path(name: str, folders: dict[str, str]) -> str:
    """os.path.realpath(name), its folder's part looked up in `folders` (files share folders)."""
    if ".." in Path(name).parts:  # resolved after the links before it, as realpath does
        return os.path.realpath(name)
    folder, base = os.path.split(os.path.abspath(name))
    if folder not in folders:
        folders[folder] = os.path.realpath(folder)
    joined = os.path.join(folders[folder], base)
    return os.path.realpath(joined) if os.path.islink(joined) else joined


def _installation_folders() -> tuple[str, ...]:
    """Python's own folders and those of installed packages, exportgate's (its version is part of
    what a cached result depends on), and the caches tools keep for themselves (matplotlib's font
    list, compiled kernels), which say nothing of the model: each as given and resolved."""
    home, temp = Path.home(), Path(tempfile.gettempdir())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache")
    folders = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
               *sysconfig.get_paths().values(), *site.getsitepackages(), site.getusersitepackages(),
               str(Path(__file__).parent), str(Path(__file__).parent.parent / "verifiers"),
               os.environ.get("MPLCONFIGDIR") or str(cache / "matplotlib"), str(home / ".config/matplotlib"),
               str(home / ".triton"), *map(str, temp.glob("torchinductor_*"))}
    return tuple({os.path.join(form, "") for f in folders if f for form in (os.path.abspath(f), os.path.realpath(f))})
