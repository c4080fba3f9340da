"""A user's input file, read and checked: records (BOMs, repeated keys, text JSON cannot hold), each checked into a
``PromptSpec`` (fields, endpoint, parameters, model rules and limits, urgency, deadline), and the passes over a whole
input (count, fingerprint, repeated ids and requests).

The top of core's parts: it uses ``wire``'s model rules and ``pricing``'s catalog; the face is
``llm_dispatch.core``."""
