"""``python -m simulator --port 8000`` serves until stopped and prints the base URL once it listens."""

from __future__ import annotations

from ._cli import main

if __name__ == "__main__":
    main()
