"""One measured variant in a fresh process: the child prints ``RESULT {json}``, the parent reads it back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def report(result: dict[str, Any]) -> None:
    """In the child: hand the figures to the parent."""
    print("RESULT " + json.dumps(result), flush=True)


def run_measured(
    argv: list[str], *, env: dict[str, str], what: str, cwd: Path | None = None, timeout: float = 900
) -> dict[str, Any]:
    """In the parent: run ``python ARGV`` and return what it reported; exit saying why when it failed."""
    proc = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, cwd=cwd, timeout=timeout)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))
