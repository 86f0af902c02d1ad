"""MegaScale-Omni for Lightning: plans for encoder-LLM multiplexing, and their runtime."""

__all__ = ["plan"]
