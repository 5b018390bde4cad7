"""An OpenAI-compatible server over vLLM, a naive Hugging Face baseline or the
workshop's teaching engine. ``python -m reference_server --help``."""

__version__ = "0.1.0"
