"""The server's routes, one router per endpoint family (as vLLM's ``entrypoints/openai``)."""
