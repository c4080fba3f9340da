"""What each provider's API looks like on the wire: paths, auth, bodies and answers (``Wire``), Anthropic's
translation, Responses and embeddings bodies, rate-limit headers, model rules and message shapes each provider
enforces, answer schemas, batch-line errors, embeddings packing.

Modules here import the vocabulary at ``core/``'s top and ``pricing`` (token estimates); the face is
``llm_dispatch.core``."""
