"""One measured variant in a fresh process: the child prints ``RESULT {json}``, the parent reads it back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def report(result: dict[str, Any]) -> None:
    """In the child: hand the figures to the parent."""
    print("RESULT " + json.dumps(result), flush=True)


def run_measured(
    argv: list[str], *, env: dict[str, str], what: str, cwd: Path | None = None, timeout: float = 900,
    python: str = sys.executable,
) -> dict[str, Any]:
    """In the parent: run ``python ARGV`` and return what it reported; exit saying why when it failed."""
    proc = subprocess.run([python, *argv], env=env, capture_output=True, text=True, cwd=cwd, timeout=timeout)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def tree_python(tree: Path) -> tuple[str, dict[str, str]]:
    """The interpreter that imports TREE's llm-dispatch, and what it adds to the environment.

    A tree with one import root is installed, not put on the path: its own ``.venv`` (``python -m venv
    TREE/.venv && TREE/.venv/bin/pip install -e TREE``). A tree from before then (``llm_dispatch/_client.py``,
    top-level ``flows``...) runs under this interpreter with the tree first on ``PYTHONPATH``.
    """
    venv = tree / ".venv" / "bin" / "python"
    if tree.resolve() == Path(__file__).resolve().parent.parent:
        return sys.executable, {}
    if venv.exists():
        return str(venv), {}
    if (tree / "llm_dispatch" / "_client.py").exists():
        return sys.executable, {"PYTHONPATH": str(tree)}
    raise SystemExit(f"{tree} has no .venv: install it first (python -m venv {tree}/.venv && "
                     f"{tree}/.venv/bin/pip install -e {tree})")


def processes_cpu(pids: Iterable[int | str]) -> float:
    """CPU seconds (user + system) so far of these processes of this machine (a PostgreSQL database's backends); a
    process gone meanwhile counts nothing."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total
