"""Runnable examples: a multimodal captioning recipe for OmniStrategy."""
