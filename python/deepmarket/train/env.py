"""Who this worker is and where its peers listen, from the environment.

  DM_RANK          this worker's rank, 0..DM_WORLD_SIZE-1 (else TF_CONFIG's
                   task index, else 0)
  DM_WORLD_SIZE    number of workers (else the length of DM_AVG_PEERS, else
                   of TF_CONFIG's worker list, else 1)
  DM_AVG_PEERS     comma-separated host:port, one per rank, where each
                   worker's averaging server listens (one TCP port per
                   worker, separate from TensorFlow's). Without it, the
                   addresses in DM_WORKERS (else TF_CONFIG's worker list)
                   with AVG_PORT_OFFSET added to each port.
  DM_AVG_HOLDER    host:port of the model's holder (the job's submitter, in
                   held mode, see holder.py): one more rank after the
                   workers', the only one the workers push to
  DM_AVG_HOLDER_RANKS  the holder's own process: host:port it listens on
                   for each worker rank, in rank order (a connection on
                   rank j's port may speak for rank j only; the node
                   exposes each to that worker's machine alone). Without
                   it the holder listens on DM_AVG_HOLDER for all ranks
  DM_ROLE          "holder" on the holder's own process (its rank is then
                   the holder's), else "worker"
  DM_VERIFY_RATE, DM_VERIFY_SHARE, DM_VERIFY_TOLERANCE  a held job's spot
                   checks ([verify]: rate, share, tolerance; see holder.py):
                   workers commit to their state each round when the rate
                   is over 0, and the holder replays that share of rounds
  DM_OUTPUT_DIR    where the coordinator writes its checkpoint
  DM_JOB_ID        tags every frame, so two jobs never average together
"""

import json
import os
from dataclasses import dataclass

from . import wire

AVG_PORT_OFFSET = 1000


@dataclass(frozen=True)
class Peers:
    """Peers is the job's averaging membership as this worker sees it."""
    rank: int
    addrs: tuple  # one "host:port" per rank
    source: str   # which variable the addresses came from, for the log
    holder: int = None  # held mode: the holder's rank (the last), else None
    rank_addrs: tuple = None  # the holder's: where it listens for each worker rank (DM_AVG_HOLDER_RANKS)

    @property
    def world(self):
        """The ranks, the holder's included."""
        return len(self.addrs)

    @property
    def workers(self):
        """The ranks that train (the holder's left out)."""
        return len(self.addrs) - (self.holder is not None)


def from_env(environ=None, rank=None, addrs=None):
    """Returns this worker's Peers; explicit rank/addrs override the environment."""
    env = os.environ if environ is None else environ
    tf_workers, tf_index = _tf_config(env.get("TF_CONFIG"))
    source = "arguments"
    if addrs is None:
        if env.get("DM_AVG_PEERS"):
            addrs, source = _split(env["DM_AVG_PEERS"]), "DM_AVG_PEERS"
        elif env.get("DM_WORKERS"):
            addrs, source = _offset(_split(env["DM_WORKERS"])), "DM_WORKERS ports + %d" % AVG_PORT_OFFSET
        elif tf_workers:
            addrs, source = _offset(tf_workers), "TF_CONFIG ports + %d" % AVG_PORT_OFFSET
    if rank is None:
        if env.get("DM_RANK"):
            rank = _int(env, "DM_RANK")
        else:
            rank = tf_index if tf_index is not None else 0
    world = _int(env, "DM_WORLD_SIZE") if env.get("DM_WORLD_SIZE") else None
    role = env.get("DM_ROLE") or "worker"
    if role not in ("worker", "holder"):
        raise ValueError("DM_ROLE=%r: want worker or holder" % role)
    if role == "holder" and not env.get("DM_AVG_HOLDER"):
        raise ValueError("DM_ROLE=holder but no DM_AVG_HOLDER (the address the holder listens on)")
    if addrs is None:
        if (world or 1) > 1:
            raise ValueError("DM_WORLD_SIZE=%d but no peer addresses: set DM_AVG_PEERS "
                             "(host:port of every worker's averaging port, in rank order)" % world)
        addrs, source = ("127.0.0.1:0",), "single worker"
    addrs = tuple(addrs)
    if world is not None and world != len(addrs):
        raise ValueError("DM_WORLD_SIZE=%d but %s names %d workers" % (world, source, len(addrs)))
    holder, rank_addrs = None, None
    if env.get("DM_AVG_HOLDER"):
        addrs, holder = addrs + (env["DM_AVG_HOLDER"].strip(),), len(addrs)
        source += " and DM_AVG_HOLDER"
        if role == "holder":
            rank = holder
            if env.get("DM_AVG_HOLDER_RANKS"):
                rank_addrs = tuple(_split(env["DM_AVG_HOLDER_RANKS"]))
                if len(rank_addrs) != holder:
                    raise ValueError("DM_AVG_HOLDER_RANKS names %d ports for %d workers" % (len(rank_addrs), holder))
                for a in rank_addrs:
                    wire.split_addr(a)
        elif rank == holder:
            raise ValueError("rank %d is the holder's: a worker's rank is 0..%d" % (rank, holder - 1))
    for a in addrs:
        wire.split_addr(a)
    if not 0 <= rank < len(addrs):
        raise ValueError("rank %d is outside 0..%d" % (rank, len(addrs) - 1))
    return Peers(rank=rank, addrs=addrs, source=source, holder=holder, rank_addrs=rank_addrs)


def _split(s):
    return [a.strip() for a in s.split(",") if a.strip()]


def _offset(addrs):
    out = []
    for a in addrs:
        host, port = wire.split_addr(a)
        out.append("%s:%d" % (host, port + AVG_PORT_OFFSET))
    return out


def _int(env, key):
    try:
        return int(env[key])
    except ValueError:
        raise ValueError("%s=%r is not an integer" % (key, env[key])) from None


def _tf_config(raw):
    if not raw:
        return None, None
    try:
        cfg = json.loads(raw)
        workers = cfg.get("cluster", {}).get("worker") or None
        task = cfg.get("task", {})
        index = int(task["index"]) if task.get("type") == "worker" and "index" in task else None
        return workers, index
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError("TF_CONFIG is not valid: %s" % e) from None
