"""Type-check the product packages with mypy, under the settings of ``[tool.mypy]`` in pyproject.toml.

    .venv/bin/python scripts/typecheck.py [extra mypy arguments]

Each layer is a directory at the repository's root installed as ``llm_dispatch.<layer>`` (the package-dir of
pyproject.toml), a mapping mypy cannot read: it finds a module by its path. So this builds the tree mypy expects
under build/typecheck/ (``llm_dispatch/__init__.py`` and ``py.typed`` copied, each layer a symbolic link to its
directory), runs ``mypy -p llm_dispatch`` there with this interpreter, and prints each path as the repository
has it (``core/_status.py``, not ``llm_dispatch/core/_status.py``). The tree stays where it is between runs, so
mypy's cache under it stays valid. Exits with mypy's status: 0 when clean.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TREE = REPO / "build" / "typecheck"
# The subpackages of llm_dispatch, each a directory at the repository's root (pyproject.toml's package-dir).
LAYERS = ("core", "storage", "jobs", "tasks", "flows", "cli", "simulator")


def build_tree() -> None:
    package = TREE / "llm_dispatch"
    package.mkdir(parents=True, exist_ok=True)
    for name in ("__init__.py", "py.typed"):
        shutil.copy2(REPO / "llm_dispatch" / name, package / name)
    for layer in LAYERS:
        link = package / layer
        if link.is_symlink() and link.readlink() == REPO / layer:
            continue
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.exists():
            shutil.rmtree(link)
        link.symlink_to(REPO / layer, target_is_directory=True)


def main() -> int:
    build_tree()
    command = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"), "-p", "llm_dispatch",
               *sys.argv[1:]]
    done = subprocess.run(command, cwd=TREE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "MYPY_FORCE_COLOR": "0"}, check=False)
    # llm_dispatch/core/x.py -> core/x.py; llm_dispatch/__init__.py is where the repository has it already.
    layer_path = re.compile(rf"^llm_dispatch/(?=(?:{'|'.join(LAYERS)})/)", re.MULTILINE)
    sys.stdout.write(layer_path.sub("", done.stdout))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
