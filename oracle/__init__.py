"""oracle: a determinism test oracle for LLM inference."""

__version__ = "0.1.0"
