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

Before each task, in the main process (where callbacks run), everything
alive is frozen for the workers the task forks (``gc.freeze()`` moves the
generations' lists whole: it costs next to nothing). A full collection
(the frozen objects thawed, collected with the rest, what is left frozen
again) runs at each play's start and whenever the heap (Python's allocated
memory blocks) has grown by a quarter since the last one: so cyclic garbage frozen with the live heap
is collected at most a play or a quarter of the heap later, and the run
does not pay a full collection before every task (37 ms each on the lab's
3 nodes: 11 of the main process's 25 CPU s in a converged re-run of
site.yml, when it did). Garbage that no cycle holds is freed as it is
dropped, frozen or not. At the run's end the heap is thawed. This changes
no result: a worker's own garbage is collected as before. Measured in
docs/scale.md (play 1 on light lab nodes, with and without it).
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: forkshare
type: notification
author: gpufleet maintainers (@gpufleet)
short_description: Freezes the controller's garbage collector before each task, so that forked workers share its memory
description:
  - Before each task and handler, in the main ansible-playbook process, freezes every object alive (gc.freeze), so that
    the workers forked for that task do not copy the main process's heap by collecting it.
  - Collects garbage fully (the frozen heap thawed first) at each play's start and whenever the heap (Python's
    allocated memory blocks) has grown by a quarter since the last full collection, so that cyclic garbage does not
    stay frozen.
  - Thaws at the end of the run. Prints nothing and changes no result.
requirements:
  - enable in configuration (callbacks_enabled)
"""

import gc
import sys

from ansible.plugins.callback import CallbackBase

# A full collection again once the heap has grown by this fraction since the last one.
GROWTH = 0.25


def refreeze() -> int:
    """Thaw, collect everything (the frozen objects too), freeze what is left; the heap's size after it.

    The size is Python's count of allocated memory blocks (``sys.getallocatedblocks``: well under a millisecond;
    ``gc.get_freeze_count`` walks the frozen list, 10 ms a call on a controller's heap)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return sys.getallocatedblocks()


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "gpufleet.fleet.forkshare"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._collected = 0  # the heap's size after the last full collection

    def _before_forks(self) -> None:
        if sys.getallocatedblocks() > self._collected * (1 + GROWTH):
            self._collected = refreeze()
        else:
            gc.freeze()

    def v2_playbook_on_play_start(self, play):
        self._collected = refreeze()

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._before_forks()

    def v2_playbook_on_handler_task_start(self, task):
        self._before_forks()

    def v2_playbook_on_stats(self, stats):
        gc.unfreeze()
