"""The rollout runtime: how experience gets from the env process to the learner.

``rollout`` (the batch layout and ``collect``), ``shm`` and ``ring`` (shared-memory slots between
one writer and one reader), ``weights`` (the versioned board the learner publishes its policy on),
``collector`` (the env process with a CPU copy of the actor), ``device_copy`` (ring slots to a
GPU without blocking) and ``data`` (RolloutDataModule, which ties the collector's life to
``fit``). It moves arrays and weights but knows no loss: any LightningModule with a ``policy``
can train on it.
"""
