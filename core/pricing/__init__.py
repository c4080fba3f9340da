"""What a request costs and where it may go: the model catalog (``prices.json``'s format), the one price formula,
lanes and their offers, routing rules, token estimates, estimates and worst cases, budget periods.

Modules here import only the vocabulary at ``core/``'s top (statuses, errors, settings' words); the face is
``llm_dispatch.core``."""
