"""torch_npu.utils._path_manager: the path checks torch_npu makes before it reads or writes a
file of the user's (Ascend's tests call them too, e.g. test_distributed.py's file barrier).

What a check finds is a warning when the path may still be used (a symbolic link, an unusual
name, no permission yet) and a RuntimeError when it cannot (a path that must exist and does not,
a file where a directory is expected, or the reverse)::

    PathManager.check_directory_path_readable("/tmp/job/barrier/4242")   # RuntimeError if missing
    PathManager.make_dir_safety("/tmp/job/out")                          # mode 0o750, if absent
"""

from __future__ import annotations

import os
import re
import shutil
import warnings

__all__ = ["PathManager"]

_PLAIN_PATH = re.compile(r"[\w.~/\s\u4e00-\u9fa5-]+")  # letters, digits, _ . ~ / - blanks and CJK


class PathManager:
    """Checks and careful creation/removal of paths (class methods only, as torch_npu's)."""

    MAX_PATH_LENGTH = 4096
    MAX_FILE_NAME_LENGTH = 255
    DATA_FILE_AUTHORITY = 0o640
    DATA_DIR_AUTHORITY = 0o750

    @classmethod
    def check_input_directory_path(cls, path: str) -> None:
        """A path a directory may be at (it need not exist yet): refused if it is a file."""
        cls._input_path_common_check(path)
        if os.path.isfile(path):
            raise RuntimeError(f"Invalid input path is a file path: {path}")

    @classmethod
    def check_input_file_path(cls, path: str) -> None:
        """A path a file may be at (it need not exist yet): refused if it is a directory."""
        cls._input_path_common_check(path)
        if os.path.isdir(path):
            raise RuntimeError(f"Invalid input path is a directory path: {path}")

    @classmethod
    def check_directory_path_writeable(cls, path: str) -> None:
        """``path`` exists (else RuntimeError); a warning if it is a link or not writable."""
        cls._existing(path, os.W_OK)

    @classmethod
    def check_directory_path_readable(cls, path: str) -> None:
        """``path`` exists (else RuntimeError); a warning if it is a link or not readable."""
        cls._existing(path, os.R_OK)

    @classmethod
    def remove_path_safety(cls, path: str) -> None:
        """Remove the directory tree at ``path`` if there is one (a link warns)."""
        cls._remove(path, shutil.rmtree, f"Failed to remove path: {path}")

    @classmethod
    def remove_file_safety(cls, file: str) -> None:
        """Remove the file ``file`` if there is one (a link warns)."""
        cls._remove(file, os.remove, f"Failed to remove file: {file}")

    @classmethod
    def make_dir_safety(cls, path: str) -> None:
        """Create the directory ``path`` (and its parents) with mode 0o750 unless it exists."""
        cls._create(
            path,
            lambda: os.makedirs(path, mode=cls.DATA_DIR_AUTHORITY, exist_ok=True),
            f"Failed to make directory: {path}",
        )

    @classmethod
    def create_file_safety(cls, path: str) -> None:
        """Create the empty file ``path`` with mode 0o640 unless it exists."""
        cls._create(
            path,
            lambda: os.close(os.open(path, os.O_WRONLY | os.O_CREAT, cls.DATA_FILE_AUTHORITY)),
            f"Failed to create file: {path}",
        )

    @classmethod
    def check_path_is_readable(cls, path: str) -> bool:
        """Whether this process may read ``path``."""
        return os.access(path, os.R_OK)

    @classmethod
    def check_path_is_writeable(cls, path: str) -> bool:
        """Whether this process may write ``path``."""
        return os.access(path, os.W_OK)

    # -- shared steps -------------------------------------------------------------------------------
    @classmethod
    def _input_path_common_check(cls, path: str) -> None:
        if len(path) > cls.MAX_PATH_LENGTH or any(len(part) > cls.MAX_FILE_NAME_LENGTH for part in path.split("/")):
            warnings.warn("Length of input path exceeds the limit.")
        if os.path.islink(path):
            warnings.warn(f"Invalid input path is a symbolic link: {path}")
        if not _PLAIN_PATH.fullmatch(path):
            warnings.warn(f"Invalid input path: {path}")

    @classmethod
    def _existing(cls, path: str, mode: int) -> None:
        if not os.path.exists(path):
            raise RuntimeError(f"The path does not exist: {path}")
        if os.path.islink(path):
            warnings.warn(f"Invalid path is a symbolic link: {path}")
        if not os.access(path, mode):
            warnings.warn(f"The path permission check failed: {path}")

    @classmethod
    def _exists_or_link(cls, path: str, what: str) -> bool:
        if os.path.islink(path):
            warnings.warn(what)
        return os.path.exists(path)

    @classmethod
    def _create(cls, path: str, create, what: str) -> None:
        if cls._exists_or_link(path, what):
            return
        try:
            create()
        except OSError as err:
            raise RuntimeError(what) from err

    @classmethod
    def _remove(cls, path: str, remove, what: str) -> None:
        if not cls._exists_or_link(path, what):
            return
        try:
            remove(path)
        except FileNotFoundError:
            return
        except OSError as err:
            raise RuntimeError(what) from err
