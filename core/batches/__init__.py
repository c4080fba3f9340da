"""Batch API files: JSONL lines built from prompts, split at each provider's limits, and their output read back
line by line.

Modules here import ``wire`` and the vocabulary; the face is ``llm_dispatch.core``."""
