"""Which of our shared-memory blocks exist: the leak checks of the runtime tests."""

import os


def our_blocks(orphans: bool = False) -> set[str]:
    """Our blocks made by this process, or (orphans) by processes that are gone.

    Other runs on the machine may hold blocks of their own meanwhile: they are not counted.
    """
    names = {n for n in os.listdir("/dev/shm") if n.startswith("omnilab_")}
    if orphans:
        return {n for n in names if not os.path.exists(f"/proc/{n.split('_')[2]}")}
    return {n for n in names if n.split("_")[2] == str(os.getpid())}
