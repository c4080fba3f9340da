"""Sending many requests: ``send_all``'s pool of workers over one client, progress, re-asks of invalid answers,
embeddings packs.

Modules here import ``http``'s run stop, ``wire``, ``pricing`` and the vocabulary; the face is
``llm_dispatch.core``."""
