"""``python -m llm_dispatch.simulator --port 8000`` serves until stopped; once it listens it prints the base URL, then a line
``Anthropic base URL: ...``."""

from __future__ import annotations

from ._cli import main

if __name__ == "__main__":
    main()
