"""The llm-dispatch command line (the top layer: it may import flows, tasks, storage and the core)."""
