"""The small exchanges the API's own bookkeeping runs, by the core's process set id (0: the job):
every rank's list of first dimensions (allgather's and allgather_object's sizes), and pickled
objects gathered or broadcast. Beneath process_sets (add_process_set checks that every rank asks
for the same set), ops and objects, so none of them imports another to exchange a few numbers.
"""

import array as _array
import pickle as _pickle

from trainrun import _core

INT64 = _core.dtypes()["int64"]
BYTE = _core.dtypes()["uint8"]


def exchange_firsts(firsts, set_id, name):
    """Allgathers each rank's list of first dimensions; returns them as a list per rank."""
    n = _core.set_size(set_id)
    mine = _array.array("q", firsts)
    everyone = _array.array("q", bytes(8 * len(firsts) * n))
    h = _core.allgatherv_async(mine.buffer_info()[0], everyone.buffer_info()[0],
                               [len(firsts)] * n, INT64, set_id, f"{name} (sizes)" if name else "",
                               [len(firsts)])
    _core.wait(h)
    k = len(firsts)
    return [list(everyone[r * k:(r + 1) * k]) for r in range(n)]


def allgather_pickled(obj, set_id, name):
    """Returns the list of every member's `obj` (pickled on the way), in the set's rank order."""
    data = _pickle.dumps(obj)
    lengths = exchange_firsts([len(data)], set_id, name)
    counts = [l[0] for l in lengths]
    mine = _array.array("B", data)
    everyone = _array.array("B", bytes(sum(counts)))
    if sum(counts):
        _core.wait(_core.allgatherv_async(mine.buffer_info()[0] if data else 0,
                                          everyone.buffer_info()[0], counts, BYTE, set_id,
                                          name or "", None))
    raw = everyone.tobytes()
    out, offset = [], 0
    for c in counts:
        out.append(_pickle.loads(raw[offset:offset + c]))
        offset += c
    return out


def broadcast_pickled(obj, root, is_root, set_id, name):
    """Returns the root's `obj` (pickled on the way) on every member; root is its index in the
    set, is_root whether this rank is it."""
    data = _pickle.dumps(obj) if is_root else b""
    length = _array.array("q", [len(data)])
    _core.wait(_core.broadcast_async(length.buffer_info()[0], 1, INT64, root, set_id,
                                     f"{name} (length)" if name else "", None))
    holder = _array.array("B", data if is_root else bytes(length[0]))
    if length[0]:
        _core.wait(_core.broadcast_async(holder.buffer_info()[0], length[0], BYTE, root,
                                         set_id, name or "", None))
    return obj if is_root else _pickle.loads(holder.tobytes())
