"""What each model and provider accepts, each rule with its source: the OpenAI families' parameters and reasoning
efforts, Claude's and Gemini's rules, the message shapes each provider takes. The input check refuses with the file
from these rules and the simulator answers the provider's 400 from the same ones.

Modules here import only the vocabulary at ``core/``'s top; the face is ``llm_dispatch.core``."""
