"""How long a host agent holds the answers it folds (``cast_relay.py``), and so how long
a sender may have to wait for an answer that is on its way (``host_share.fail_member``).
"""

from __future__ import annotations

from ..settings import env_number

#: A result bigger than this (its buffers) leaves the agent at once in a frame of its own
#: rather than folded with others: folding saves frames of small replies, not copies.
FOLD_BYTES = 1 << 20
#: How long an agent holds the answers it has while others of the same sender's casts are
#: still out (once all are in, they leave at once): a slow member costs the others this.
FOLD_WINDOW = env_number("HPCMESH_RELAY_FOLD_US", 200, unit="microseconds") * 1e-6
#: How long an agent in a tree holds what it has once only agents below it still owe
#: answers (they are a hop behind its own members; a call() waits for the last answer
#: anyway): the sender then reads one frame per head, not one per head and per late hop.
FOLD_BELOW = 10 * FOLD_WINDOW
#: How long an agent holds the answers of a call() its sender waits on alone through it
#: (the cast says ``hold``) until the rest are in: the call() ends with its last answer
#: anyway, so the sender reads one frame per head, not one per burst of answers (on a
#: busy machine a call()'s answers spread over a tenth of a second). Short beside the
#: straggler watch's thresholds (seconds), which read the answers that came.
HOLD = max(FOLD_BELOW, 0.2) if FOLD_WINDOW > 0 else 0.0
