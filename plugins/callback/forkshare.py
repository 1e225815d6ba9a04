"""Keep the controller's forked workers sharing the main process's memory: the garbage collector frozen before each
task.

Ansible forks a worker per host and task (up to ``forks`` at a time). A fork
shares the main process's pages until one is written. CPython's cyclic
garbage collector writes into the header of every object it walks, so the
first full collection in a worker copies most of the main process's heap
(the inventory, every host's variables and facts) into that worker. On 100
light lab nodes the 25 workers of play 1 held 1245 MiB PSS of the 1477 MiB
peak (docs/scale.md). ``gc.freeze()`` moves every object alive into a
permanent generation that no collection walks (Python's gc documentation:
"gc.freeze() right before fork()"), so a worker collects only what it
allocates itself.

Before each task, in the main process (where callbacks run): the frozen
objects are thawed, collected with the rest (so that nothing the run drops
stays frozen for good), and everything left is frozen again for the workers
the task forks. At the run's end the heap is thawed. This changes no
result: a worker's own garbage is collected as before. Measured in
docs/scale.md (play 1 on light lab nodes, with and without it).
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: forkshare
type: notification
author: gpufleet maintainers (@gpufleet)
short_description: Freezes the controller's garbage collector before each task, so that forked workers share its memory
description:
  - Before each task and handler, in the main ansible-playbook process, collects garbage once and freezes every object
    left (gc.freeze), so that the workers forked for that task do not copy the main process's heap by collecting it.
  - Thaws at the end of the run. Prints nothing and changes no result.
requirements:
  - enable in configuration (callbacks_enabled)
"""

import gc

from ansible.plugins.callback import CallbackBase


def refreeze() -> None:
    """Thaw, collect everything (the frozen objects too), freeze what is left."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "gpufleet.fleet.forkshare"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_task_start(self, task, is_conditional):
        refreeze()

    def v2_playbook_on_handler_task_start(self, task):
        refreeze()

    def v2_playbook_on_stats(self, stats):
        gc.unfreeze()
