"""Environments: the C++ batch pool and everything that makes it a set of RL tasks.

``pool`` (BatchEnvPool, the Python face of ``_core``), ``tasks/`` (the task registry and the
numpy twins), ``vector_env`` (TaskVectorEnv: one C++ call per step), ``randomization`` (reset-time
domain randomization a recipe can name), ``assets`` (robot scenes), and the adapters to the
outside: ``gym`` (PoolVectorEnv), ``registration`` (the ``omnilab/`` gymnasium ids) and
``render``. They stand on ``_core`` and numpy only, never on torch or Lightning, so the runtime and
the third-party integrations build on them without the learner.
"""
