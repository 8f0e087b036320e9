"""The per-vnode load of a batch, as ``commit_batch`` reports it to the coordinator
(``load``: vnode -> ``[ops, bytes]``; the Handover Manager balances on it)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

__all__ = ["vnode_load"]


def vnode_load(vnodes: Any, num_vnodes: int, *, ops: Optional[Any] = None,
               nbytes: Optional[Any] = None) -> dict[str, list[float]]:
    """``{vnode: [ops, bytes]}`` of the vnodes a batch touched.

    ``vnodes`` is the vnode of each item (a key written, a key group of input rows),
    ``ops`` the operations each item counts for (1 each when None) and ``nbytes`` its
    bytes (0 when None). Vnodes with no operation are left out."""
    vn = np.asarray(vnodes, dtype=np.int64)
    if not len(vn):
        return {}
    n_ops = np.bincount(vn, weights=None if ops is None else np.asarray(ops, dtype=np.float64),
                        minlength=num_vnodes)
    n_bytes = (np.bincount(vn, weights=np.asarray(nbytes, dtype=np.float64), minlength=num_vnodes)
               if nbytes is not None else np.zeros(len(n_ops)))
    return {str(int(v)): [float(n_ops[v]), float(n_bytes[v])] for v in np.flatnonzero(n_ops)}
