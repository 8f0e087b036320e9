"""The state client: how a task reads and writes the state a worker hosts.

A task (a Spark micro-batch's, say) connects to the worker of its host over a
Unix domain socket, or to a worker elsewhere over TCP, with the cluster's
shared secret, and opens one **session** per instance and batch::

    import rhino

    client = rhino.connect("/var/run/rhino/w1.sock", secret=open("secret").read())
    with client.session("q8", 3, batch=42, epoch=7) as s:
        old = s.get_batch(keys)            # the state at version 41, plus this session's own writes
        s.put_batch(keys, new_values)
        s.delete_batch(gone)
        for key, value in s.scan(prefix=b"auction:"):
            ...
        s.commit()                         # version 42: written, checkpointed, on the chain

Leaving the ``with`` block without a commit aborts the session: nothing of it
is visible. So does the death of the task, or a lost connection. See
docs/design.md §2 and §5, and docs/protocol.md §7 for the wire contract.
"""

from .client import Client, connect
from .reader import CheckpointReader
from .session import CommitResult, Session

__all__ = ["connect", "Client", "Session", "CommitResult", "CheckpointReader"]
