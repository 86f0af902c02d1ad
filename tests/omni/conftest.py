"""Shared settings for the omni planning tests: modest example counts, no deadlines."""

from hypothesis import settings

settings.register_profile("omni", max_examples=60, deadline=None)
settings.load_profile("omni")
