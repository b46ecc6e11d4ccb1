"""The one build of hccl-py's C code at install: the prefix of HCCL's C API
(hccl_py/native/build.py, loaded by path: hccl_py is not importable while it installs). Without
a C compiler the Python package installs all the same, and the build says why it skipped."""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _native_build():
    spec = importlib.util.spec_from_file_location("hccl_py_native_build", HERE / "hccl_py" / "native" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildWithNative(build_py):
    """build_py, then the prefix: in the source tree for an editable install, in the wheel otherwise."""

    def run(self):
        super().run()
        native = _native_build()
        root = HERE if getattr(self, "editable_mode", False) else Path(self.build_lib)
        native.build(root / "hccl_py" / "native" / "prefix")


setup(cmdclass={"build_py": BuildWithNative})
