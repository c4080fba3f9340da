"""Paying for a shared prefix once: each provider's prompt-cache rules, the prefixes a job's prompts share, and the
plan that makes each provider cache them (keys, breakpoints, warm-ups, order).

Modules here import ``pricing`` (token estimates, prices), ``wire`` and the vocabulary; the face is
``llm_dispatch.core``."""
