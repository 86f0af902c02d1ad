"""Pure planning: every function here is deterministic and free of torch and processes.

Same input, same plan on every rank: no rank needs to talk to agree on a plan.
"""
