"""Where the tritonserver shipped by nvidia-pytriton lives, and how to make it runnable.

The wheel carries a real tritonserver with the Python backend, but the backend's stub
(`triton_python_backend_stub`) comes as one build per Python version, outside the backend
directory. The stub embeds libpython: it must match the interpreter that serves the models,
and it must find that interpreter's shared library (LD_LIBRARY_PATH) and environment (PATH).
"""

from __future__ import annotations

import filecmp
import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from dflash_trt.errors import DFlashError

STUB_NAME = "triton_python_backend_stub"
# A full Triton installation to use instead of nvidia-pytriton's (the NGC image: /opt/tritonserver).
HOME_VARIABLE = "DFLASH_TRITON_HOME"


class ServerError(DFlashError):
    """tritonserver cannot be found, started, or did not become ready."""


def triton_home() -> Path:
    """The Triton installation to run: $DFLASH_TRITON_HOME if set, else nvidia-pytriton's (not imported)."""
    if os.environ.get(HOME_VARIABLE):
        home = Path(os.environ[HOME_VARIABLE])
        if not (home / "bin" / "tritonserver").is_file():
            raise ServerError(f"{HOME_VARIABLE}={home}: no bin/tritonserver there")
        return home
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServerError("nvidia-pytriton is not installed; run `make setup` (it installs the serve extra)")
    home = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    if not (home / "bin" / "tritonserver").is_file():
        raise ServerError(f"no tritonserver binary under {home}")
    return home


def python_version_tag(version_info=sys.version_info) -> str:
    return f"{version_info[0]}.{version_info[1]}"


def install_python_stub(home: Path, version: str | None = None) -> Path:
    """Copy the stub for `version` (default: this interpreter) into backends/python; idempotent.

    The copy goes through a temporary file and an atomic rename, so servers started in
    parallel never see a half-written stub.
    """
    version = version or python_version_tag()
    target = home / "backends" / "python" / STUB_NAME
    if not (home / "python_backend_stubs").is_dir() and target.is_file():
        return target  # a full Triton installation ships its stub in place
    source = home / "python_backend_stubs" / version / STUB_NAME
    if not source.is_file():
        available = sorted(p.name for p in (home / "python_backend_stubs").iterdir())
        raise ServerError(f"no Python backend stub for Python {version} (available: {', '.join(available)})")
    if target.is_file() and filecmp.cmp(source, target, shallow=False):
        return target
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{STUB_NAME}.")
    os.close(fd)
    shutil.copy2(source, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    return target


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for tritonserver so that its Python stub runs in this interpreter's environment.

    - LD_LIBRARY_PATH starts with this interpreter's LIBDIR, else the stub may load the
      system libpython.
    - PATH starts with this interpreter's bin directory: the stub ignores PYTHONPATH and
      takes its packages from the `python3` it finds first on PATH (a venv works).
    """
    env = dict(os.environ if base is None else base)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = _prepend(libdir, env.get("LD_LIBRARY_PATH", ""))
    env["PATH"] = _prepend(str(Path(sys.executable).parent), env.get("PATH", ""))
    return env


def _prepend(first: str, rest: str) -> str:
    parts = [first] + [p for p in rest.split(os.pathsep) if p and p != first]
    return os.pathsep.join(p for p in parts if p)
