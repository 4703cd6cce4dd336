"""Elastic DiLoCo averaging between a job's workers, over plain TCP.

The global state is (round r, weights theta_r, outer momentum m_r). Every
worker holds a copy; a worker starts round r from theta_r, takes its inner
steps, and hands in its pseudo-gradient delta = theta_r - theta_local.

One worker per round is the coordinator. It collects the deltas of round r
(its own included) until every member it waits for has handed one in, or
`timeout` seconds after its own was ready; averages them; encodes the
average with the job's codec and decodes it again (so it uses exactly what
it sends); applies the outer optimizer (SGD, Nesterov momentum) to get
theta_{r+1}; and replies to every member with the encoded average, the
new round, the digest of theta_{r+1}, the members of the next round and
who coordinates it. Each member applies the same outer step to its own
copy; the arithmetic is elementwise float32 on identical inputs, so the
results are bit-identical, and the digest proves it: a member whose copy
disagrees fetches the coordinator's full state instead.

Why the copies stay identical: a worker's theta changes only (a) when it
applies a coordinator's update to the state that update was computed from
(same round and digest, checked), or (b) when it adopts a coordinator's or
peer's full state (checked against its digest). A push whose round or digest
does not match the coordinator's state is never averaged: the pusher is sent
the update it missed (one round behind) or the full state. So every worker
that hears from a coordinator ends each round on that coordinator's theta.

Elasticity:
  - A member that dies closes its connection (or stops answering): the
    coordinator stops waiting for it at once (or after `timeout`), and the
    round goes on with those who answered.
  - A restarted worker (same rank) asks every peer for its round, fetches the
    full state (theta, momentum, round) from the newest one, registers with
    the coordinator, and takes only the inner steps left in the current round
    so it reaches the round's end with the others.
  - If the coordinator dies, the members find out when their push fails; each
    takes the lowest live rank of the last round's membership (the same list
    for everyone) as the new coordinator, which continues from its own copy
    of theta (identical to the dead coordinator's at the round's start).
  - The coordinator names the next round's coordinator, the lowest live
    member, so a restarted low rank takes the role back at a round boundary,
    never in the middle of a round.
  - A worker leaving says so (bye), so nobody waits for it.

The coordinator writes theta, the momentum and the round to checkpoint_dir
after its rounds; a worker that finds one there starts from it (a re-placed
job resumes), unless a live peer is further along.

Held mode (peers.holder set, see holder.py): one more rank, the holder
(the job's submitter), keeps the model. It coordinates every round and
never trains; the workers push their deltas to it only, never coordinate,
and never serve; it checks each delta before it averages it, and the
update it sends back averages only those it accepted. A worker that cannot
reach the holder for `timeout` fails (HolderGone); one the holder dropped
for its refused updates fails too (Dropped).

Spot checks (held mode, optional): a worker given its state at each
round's start (commit_start: its inner optimizer's state and its data
cursor) sends that state's digest with its push, a commitment; when the
holder's answer names a round to check, the worker sends the state itself
(a "proof"), and the holder replays the round's inner steps from it to see
that the update is what those steps make (holder.py).

This module needs numpy only; keras_callback.py adapts it to Keras.
"""

import hashlib
import json
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .. import progress
from . import codec as codecs
from . import evidence
from . import wire
from .evidence import digest  # a short hash of the weights' exact bytes

CHECKPOINT = "diloco-state.npz"
KEEPALIVE = 2.0        # seconds between "wait" frames while a member waits for a round
SILENCE = 15.0         # a member gives up on a coordinator silent this long
RETRY = 0.2            # pause before retrying after a redirect or a failed join


class HolderGone(ConnectionError):
    """The model's holder (held mode) did not answer for the averager's timeout."""


class Dropped(RuntimeError):
    """The model's holder (held mode) dropped this worker: it refused its updates."""


@dataclass
class Sync:
    """Sync is what a worker does next after joining or after a round."""
    theta: np.ndarray  # the global weights to continue from (flat float32)
    round: int         # the round they start
    steps: int         # inner steps to take in this round (0: sync again at once)
    stop: bool         # the job asked every worker to stop
    outcome: str       # founded, joined, resumed, update, late, resync, coordinated, alone


@dataclass
class _State:
    round: int
    theta: np.ndarray
    mom: np.ndarray
    stop: bool = False
    steps: int = 0                                # inner steps of all workers, all rounds
    contrib: dict = field(default_factory=dict)   # str(rank) -> rounds it contributed to
    digest: str = ""

    def seal(self):
        self.digest = digest(self.theta)
        return self


def outer_step(theta, mom, delta, lr, momentum, nesterov=True, mask=None):
    """Returns (theta', m') after one outer SGD step on the averaged pseudo-gradient.

    m' = momentum*m + delta; theta' = theta - lr*(delta + momentum*m') with
    Nesterov, theta - lr*m' without. Where mask is False (non-trainable
    weights, e.g. batch-norm statistics) theta' = theta - delta, the plain
    average of the workers' values. Pure float32 elementwise arithmetic: the
    same inputs give the same bits on every worker.
    """
    lr, mu = np.float32(lr), np.float32(momentum)
    m = mu * mom + delta
    step = delta + mu * m if nesterov else m
    new = theta - lr * step
    if mask is not None:
        new = np.where(mask, new, theta - delta)
        m = np.where(mask, m, np.float32(0))
    return new.astype(np.float32, copy=False), m.astype(np.float32, copy=False)


class Averager:
    """Averager runs one worker's side of elastic DiLoCo averaging.

    Averager(peers, sync_every=H) only builds; start() opens the server and
    joins, sync() ends a round, close() leaves. start/sync/close are called
    from one thread (the training loop); the server answers peers from its
    own threads. Defaults: compress "int8", outer_lr 0.7, outer_momentum 0.9,
    nesterov True, timeout 60 s (how long a coordinator waits for members
    after its own delta is ready), join_timeout 120 s (how long a rank > 0
    waits at start for a peer to join; rank 0 does not wait, but its first
    round waits this long for the others to join),
    connect_timeout 10 s (connect and first answer), checkpoint_dir None
    (no checkpoint), checkpoint_every 1 round, job "" (frames from another
    job are refused), log print.
    """

    def __init__(self, peers, sync_every, compress="int8", outer_lr=0.7, outer_momentum=0.9,
                 nesterov=True, timeout=60.0, join_timeout=120.0, connect_timeout=10.0,
                 checkpoint_dir=None, checkpoint_every=1, job="", log=None):
        if int(sync_every) < 1:
            raise ValueError("sync_every must be >= 1")
        self.peers = peers
        self.rank, self.world = peers.rank, peers.world
        self.holder = getattr(peers, "holder", None)  # held mode: the rank that keeps the model
        self.held = self.holder is not None and self.rank != self.holder
        self.H = int(sync_every)
        self.codec = codecs.normalize(compress)
        self.outer_lr, self.outer_momentum, self.nesterov = float(outer_lr), float(outer_momentum), bool(nesterov)
        self.timeout, self.join_timeout, self.connect_timeout = float(timeout), float(join_timeout), float(connect_timeout)
        self.checkpoint_dir, self.checkpoint_every = checkpoint_dir, max(1, int(checkpoint_every))
        self.job = job or ""
        self._log = log or (lambda msg: print(msg, flush=True))
        self.progress = 0  # the training loop's steps into the current round (H - steps left)

        self._cv = threading.Condition()
        self._state = None
        self._mask = None
        self._established = False
        self._closing = False
        self._coord = self.rank          # who coordinates the current round
        self._members = {self.rank}      # the current round's membership
        self._dead = set()               # ranks found gone (unreachable, dropped, left)
        self._lagging = set()            # members that missed a deadline (coordinator)
        self._pending = {}               # rank -> (delta or None, steps, stop) for the open round
        self._results = {}               # from_round -> (prev digest, header, payload)
        self._conns = {}                 # rank -> open connections from it
        self._link = None                # (rank, socket) to our coordinator
        self._listener = None
        self._listeners = []
        self._threads = []
        self._socks = set()
        self._io = threading.Lock()
        self.stats = {"rank": self.rank, "world": self.world, "joined_round": None, "joined_how": None,
                      "last_round": None, "rounds": 0, "rounds_coordinated": 0, "late": 0, "resyncs": 0,
                      "refused": 0, "refused_run": 0,
                      "bytes_sent": 0, "bytes_received": 0, "seconds": 0.0}
        self._t0 = None
        # Held mode: where refused rounds' evidence goes (evidence.py), the
        # model's description for it, the last push (round, theta, decoded
        # delta, steps) and the weights before the last update that moved them.
        self.evidence_dir = os.environ.get("DM_EVIDENCE_DIR") or None
        self.model_description = None
        self._sent = None
        self._before_last = None
        self._expect_until = 0.0         # a founder's first round waits for all until then
        self._proofs = {}                # round -> (state bytes, digest, data cursor): spot checks

    # ------------------------------------------------------------ public API

    @property
    def round(self):
        return self._state.round if self._state else 0

    @property
    def steps_total(self):
        """Inner steps of all workers in all rounds so far (as the coordinators counted them)."""
        return self._state.steps if self._state else 0

    @property
    def theta(self):
        """The global weights of the current round (flat float32, read only)."""
        return self._state.theta

    @property
    def is_coordinator(self):
        return self._coord == self.rank

    def start(self, theta, trainable=None):
        """Opens the server, joins the job and returns the weights to start from."""
        self._t0 = time.monotonic()
        theta = np.ascontiguousarray(theta, dtype=np.float32).ravel().copy()
        self._n = theta.size
        if trainable is not None:
            trainable = np.asarray(trainable, dtype=bool).ravel()
            if trainable.size != theta.size:
                raise ValueError("trainable mask has %d entries for %d weights" % (trainable.size, theta.size))
            self._mask = None if trainable.all() else trainable
        own = None if self.held else self._load_checkpoint()
        how = "resumed" if own else "founded"
        if own is None:
            own = _State(round=0, theta=theta, mom=np.zeros_like(theta)).seal()
        self._state = own
        progress = 0
        if self.held:
            how, progress = "joined", self._join_holder()
        elif self.world > 1:
            self._serve()
            adopted = self._join(own) if self.holder is None else None
            if adopted is not None:
                how, progress = "joined", adopted
        with self._cv:
            if how != "joined":
                # We start the job: the first round waits for everyone to
                # join (up to join_timeout from our start), as they were all
                # launched with us; later rounds wait only for who is there.
                self._members = set(range(self.world))
                self._dead.clear()
                self._expect_until = self._t0 + self.join_timeout
            self._established = True
        st = self._state
        self.stats["joined_round"], self.stats["joined_how"] = st.round, how
        self._log("%s round %d (digest %s), %s; coordinator rank %d, %d peers from %s"
                  % (how, st.round, st.digest, self.codec, self._coord, self.world, self.peers.source))
        return Sync(st.theta.copy(), st.round, max(0, self.H - progress), st.stop, how)

    def sync(self, local, steps, stop=False):
        """Ends this worker's round after `steps` inner steps from the round's
        theta to `local`; returns the next round's weights and step count."""
        st = self._state
        delta = None
        if steps > 0:
            local = np.ascontiguousarray(local, dtype=np.float32).ravel()
            delta = st.theta - local
        if self.world == 1:
            res = self._alone(local if steps > 0 else st.theta, steps, stop)
        else:
            res = self._exchange(delta, steps, stop)
        self.progress = self.H - res.steps
        return res

    def _exchange(self, delta, steps, stop):
        if self.held:
            return self._exchange_held(delta, steps, stop)
        # Redirects (a peer pointing at another coordinator) are followed for
        # at most `timeout`; after that we coordinate ourselves rather than
        # stall, and digests reconcile the copies once peers hear each other.
        give_up = time.monotonic() + self.timeout
        while True:
            with self._cv:
                c = self._coord
            if c == self.rank or time.monotonic() > give_up:
                return self._coordinate(delta, steps, stop)
            try:
                h, p = self._push(c, delta, steps, stop)
                t = h["t"]
                if t == "update":
                    res = self._apply(c, h, p)
                    if res is None:  # our copy disagrees: take the coordinator's
                        self._log("resync from rank %d: its update does not reproduce its digest" % c)
                        h, p = self._request(c, {"t": "hello", "join": True, "want_state": True}, reuse=True)
                        t = h["t"]
                    else:
                        return res
                if t == "state" and h.get("has_state"):
                    return self._adopt(h, p, "resync")
            except (OSError, EOFError, ValueError, wire.ProtocolError) as e:
                self._gone(c, "exchange with rank %d failed: %s" % (c, _why(e)))
                give_up = time.monotonic() + self.timeout
                continue
            if t == "redirect" and isinstance(h.get("to"), int) and 0 <= h["to"] < self.world:
                with self._cv:
                    self._dead.discard(h["to"])
                    self._coord = h["to"]
            elif t == "bye":
                self._gone(c, "rank %d is leaving" % c)
                give_up = time.monotonic() + self.timeout
                continue
            elif t != "state":
                self._gone(c, "rank %d answered %r" % (c, h))
                continue
            time.sleep(RETRY)  # redirected, or the peer is still joining

    def _exchange_held(self, delta, steps, stop):
        """Pushes our delta to the holder and applies its update, retrying
        a holder that does not answer for up to `timeout`."""
        give_up = time.monotonic() + self.timeout
        c = self.holder
        while True:
            try:
                h, p = self._push(c, delta, steps, stop)
                update = h
                if h["t"] == "update":
                    res = self._apply(c, h, p)
                    if res is not None:
                        self._answer_check(c, update)
                        return res
                    self._log("resync from the holder: its update does not reproduce its digest")
                    h, p = self._request(c, {"t": "hello", "join": True, "want_state": True}, reuse=True)
                if h["t"] == "state" and h.get("has_state"):
                    res = self._adopt(h, p, "resync")
                    self._answer_check(c, update)
                    return res
                why = "it answered %r" % h.get("t")
            except (OSError, EOFError, ValueError, wire.ProtocolError) as e:
                why = _holder_failure(e)
            if time.monotonic() > give_up:
                raise HolderGone("the model's holder (rank %d) did not answer for %.0fs: %s" % (c, self.timeout, why))
            time.sleep(RETRY)

    def commit_start(self, state, cursor):
        """Records this worker's state at the start of the current round
        (held mode with spot checks): the bytes of its inner optimizer's
        state and how many batches it has trained on so far. Their digest
        goes with this round's push; the bytes go to the holder if it asks
        to check the round. The last two rounds are kept."""
        r = self.round
        self._proofs[r] = (bytes(state), hashlib.sha256(state).hexdigest(), int(cursor))
        for old in [k for k in self._proofs if k < r - 1]:
            del self._proofs[old]

    def _answer_check(self, c, h):
        """Sends the holder the state it asked for to replay a round (a
        spot check); a round whose state we no longer have goes unanswered."""
        rc = h.get("check")
        if not isinstance(rc, int):
            return
        proof = self._proofs.get(rc)
        if proof is None:
            self._log("the holder asked to check round %d, whose state this worker no longer has" % rc)
            return
        try:
            rh, _ = self._request(c, {"t": "proof", "for_round": rc, "cursor": proof[2]}, proof[0], reuse=True)
            if rh.get("t") != "ok":
                self._log("the holder answered the state of round %d with %r" % (rc, rh.get("t")))
        except (OSError, EOFError, ValueError, wire.ProtocolError) as e:
            self._log("could not send the state of round %d for its spot check: %s" % (rc, _why(e)))

    def request_stop(self):
        """Marks the global state stopped: the next round tells every worker."""
        with self._cv:
            self._state.stop = True

    def close(self, finished=False):
        """Leaves the job: a coordinator first waits (up to timeout) until its
        members have their last round, then every connection is closed.
        finished: training is over, so the checkpoint goes (as Keras'
        BackupAndRestore does); otherwise the coordinator writes a last one."""
        if self._t0 is not None:
            self.stats["seconds"] = round(time.monotonic() - self._t0, 3)
        self.stats["last_round"] = self.round
        if finished and not self.held:
            self._remove_checkpoint()
        if self.held:
            if self._link:
                try:
                    self._send(self._link[1], {"t": "bye", "leaving": True})
                except OSError:
                    pass
            self._drop_link()
            return
        if self.world == 1 or self._listener is None:
            if not finished:
                self._save_checkpoint()
            return
        end = time.monotonic() + self.timeout
        with self._cv:
            if self._coord == self.rank:
                if not finished:
                    self._save_checkpoint()
                # Members still to come for a round we coordinate would wait in vain.
                while (self._members - {self.rank} - self._dead) and time.monotonic() < end:
                    self._cv.wait(0.2)
            self._closing = True
            self._cv.notify_all()
        self._announce_leaving()
        self._stop_server()
        for th in self._threads:
            th.join(timeout=5)
        self.stats["seconds"] = round(time.monotonic() - self._t0, 3)

    def _announce_leaving(self):
        """Says bye to every live peer, so no coordinator waits for us."""
        if self._link:
            try:
                self._send(self._link[1], {"t": "bye", "leaving": True})
            except OSError:
                pass
        linked = self._link[0] if self._link else None
        self._drop_link()
        with self._cv:
            others = [j for j in range(self.world) if j not in (self.rank, linked) and j not in self._dead]

        def bye(j):
            try:
                sock = wire.dial(self.peers.addrs[j], self.connect_timeout)
                with sock:
                    self._send(sock, self._header({"t": "bye", "leaving": True}))
            except OSError:
                pass

        if others:
            with ThreadPoolExecutor(max_workers=min(16, len(others))) as ex:
                list(ex.map(bye, others))

    # ------------------------------------------------------------ joining

    def _join(self, own):
        """Finds the newest established peer and adopts its state; returns its
        progress in the current round, or None to keep our own state."""
        deadline = time.monotonic() + (0 if self.rank == 0 else self.join_timeout + 5 * self.rank)
        waited = False
        while True:
            infos = self._survey()
            est = {j: h for j, h in infos.items() if h.get("established")}
            if est:
                best = max(est, key=lambda j: (est[j]["round"], -j))
                if est[best]["round"] < own.round:
                    self._log("keeping checkpoint round %d: peers are at round %d" % (own.round, est[best]["round"]))
                    return None
                src = est[best].get("coord", best)
                if src not in est or est[src]["round"] != est[best]["round"]:
                    src = best
                try:
                    h, p = self._request(src, {"t": "hello", "join": True, "want_state": True})
                    if h.get("t") == "state" and h.get("has_state"):
                        self._adopt(h, p, None)
                        return int(h.get("progress", 0))
                except (OSError, EOFError, ValueError, wire.ProtocolError) as e:
                    self._log("join: fetching the state from rank %d failed: %s" % (src, _why(e)))
            if time.monotonic() >= deadline:
                if waited:
                    self._log("no established peer after %.0fs: starting from our own weights" % self.join_timeout)
                return None
            if not waited:
                self._log("waiting for a peer to join from (up to %.0fs)" % (deadline - time.monotonic()))
                waited = True
            time.sleep(0.25)

    def _join_holder(self):
        """Fetches the holder's state (held mode), waiting up to join_timeout
        for it to answer; returns its progress in the current round."""
        deadline = time.monotonic() + self.join_timeout
        while True:
            try:
                h, p = self._request(self.holder, {"t": "hello", "join": True, "want_state": True})
                if h.get("t") == "state" and h.get("has_state"):
                    self._adopt(h, p, None)
                    return int(h.get("progress", 0))
                why = "it is not ready"
            except (OSError, EOFError, ValueError, wire.ProtocolError) as e:
                why = _holder_failure(e)
            if time.monotonic() >= deadline:
                raise HolderGone("the model's holder (rank %d) did not answer for %.0fs: %s"
                                 % (self.holder, self.join_timeout, why))
            time.sleep(0.25)

    def _survey(self):
        """Asks every peer for its round (in parallel); returns rank -> header."""
        others = [j for j in range(self.world) if j != self.rank]

        def ask(j):
            try:
                h, _ = self._request(j, {"t": "hello"})
                return j, h if h.get("t") == "state" else None
            except (OSError, EOFError, ValueError, wire.ProtocolError):
                return j, None

        with ThreadPoolExecutor(max_workers=min(16, len(others))) as ex:
            got = dict(ex.map(ask, others))
        with self._cv:
            for j, h in got.items():
                if h is None:
                    self._dead.add(j)
                else:
                    self._dead.discard(j)
        return {j: h for j, h in got.items() if h is not None}

    # ------------------------------------------------------------ rounds

    def _alone(self, local, steps, stop):
        with self._cv:
            st = self._state
            st.theta = np.array(local, dtype=np.float32)
            st.round += 1
            st.steps += steps
            st.stop = st.stop or stop
            st.contrib[str(self.rank)] = st.contrib.get(str(self.rank), 0) + 1
            st.seal()
        self.stats["rounds"] += 1
        if st.round % self.checkpoint_every == 0:
            self._save_checkpoint()
        return Sync(st.theta.copy(), st.round, self.H, st.stop, "alone")

    def _coordinate(self, delta, steps, stop):
        with self._cv:
            self._coord = self.rank
            st = self._state
            r = st.round
            self._pending[self.rank] = (delta, steps, stop)
            self._cv.notify_all()
            end = max(time.monotonic() + self.timeout, self._expect_until)
            self._expect_until = 0.0
            while True:
                waiting = sorted(j for j in self._members
                                 if j != self.rank and j not in self._dead
                                 and j not in self._lagging and j not in self._pending)
                left = end - time.monotonic()
                if not waiting or left <= 0:
                    break
                self._cv.wait(min(left, 1.0))
            if waiting:
                self._lagging.update(waiting)
                self._log("round %d: closing without rank(s) %s (no delta within %.0fs)"
                          % (r, ",".join(map(str, waiting)), self.timeout))
            entries = sorted(self._pending.items())
            self._pending = {}
            stop_all = st.stop or any(x[2] for _, x in entries)
            # A stop keeps the weights it was asked at (those that reached a
            # target, say): the steps of the round it ends are dropped.
            got = [] if stop_all else [(j, d, s) for j, (d, s, _) in entries if s > 0 and d is not None]
            refused = sorted(j for j, (d, s, _) in entries if s > 0 and d is None and j != self.rank)
            prev = st.digest
            header = {"t": "update", "from_round": r, "round": r + 1, "prev": prev,
                      "ranks": [j for j, _, _ in got], "steps": sum(s for _, _, s in got), "refused": refused}
            payload = b""
            new = _State(round=r + 1, theta=st.theta, mom=st.mom, stop=stop_all,
                         steps=st.steps + header["steps"], contrib=dict(st.contrib))
            if got:
                acc = np.zeros(self._n, dtype=np.float32)
                for _, d, _ in got:
                    acc += d
                acc /= np.float32(len(got))
                meta, payload = codecs.encode(acc, self.codec)
                header.update(meta)
                new.theta, new.mom = outer_step(st.theta, st.mom, codecs.decode(meta, payload),
                                                self.outer_lr, self.outer_momentum, self.nesterov, self._mask)
            for j, _, _ in got:
                new.contrib[str(j)] = new.contrib.get(str(j), 0) + 1
            new.seal()
            members = sorted(m for m in self._members | {self.rank} if m not in self._dead)
            self._members = set(members)
            self._coord = self.rank if self.holder is not None else min(members)
            header.update(digest=new.digest, stop=stop_all, members=members, coord=self._coord)
            self.progress = 0
            self._results[r] = (prev, header, payload)
            self._results.pop(r - 3, None)
            self._state = new
            self._closed(r, got, refused, header)
            self._cv.notify_all()
        self.stats["rounds"] += 1 if steps > 0 else 0
        self.stats["rounds_coordinated"] += 1
        if new.round % self.checkpoint_every == 0:
            self._save_checkpoint()
        return Sync(new.theta.copy(), new.round, self.H, new.stop, "coordinated")

    def _closed(self, r, got, refused, header):
        """Called (with _cv held) as round r closes with the accepted deltas
        got and the ranks whose deltas were refused; the holder keeps its
        accounts here."""

    def _vet(self, j, r, delta, h=None, payload=b""):
        """Returns delta if rank j's delta for round r may be averaged, else
        None with why: one with NaN or infinite values never is (it would
        poison every copy, or fail the round's encoding). The holder checks
        more (h is the push's header, payload its encoded delta)."""
        if not np.isfinite(delta).all():
            self._log("round %d: refused rank %d's update: not finite" % (r, j))
            return None, "not finite"
        return delta, ""

    def _apply(self, c, h, p):
        """Applies coordinator c's update to our copy; None if the result
        would not be the coordinator's theta (then we fetch its state)."""
        st = self._state
        if h.get("from_round") != st.round or h.get("prev") != st.digest:
            return None
        new = _State(round=int(h["round"]), theta=st.theta, mom=st.mom, stop=st.stop or bool(h.get("stop")),
                     steps=st.steps + int(h.get("steps", 0)), contrib=dict(st.contrib))
        if h.get("ranks"):
            avg = codecs.decode(h, p)
            if avg.size != self._n:
                return None
            new.theta, new.mom = outer_step(st.theta, st.mom, avg, self.outer_lr, self.outer_momentum,
                                            self.nesterov, self._mask)
        for j in h.get("ranks", []):
            new.contrib[str(j)] = new.contrib.get(str(j), 0) + 1
        new.seal()
        if new.digest != h.get("digest"):
            return None
        with self._cv:
            self._state = new
            self._members = set(h.get("members") or []) | {self.rank}
            self._coord = h.get("coord", c)
        late = "progress" in h  # only replies to a push after the round closed carry it
        if self.rank in h.get("ranks", []):
            self.stats["rounds"] += 1
            self.stats["refused_run"] = 0
            self._answered()
        if self.rank in h.get("refused", []):
            self.stats["refused"] += 1
            self.stats["refused_run"] += 1
            self._log("round %d: the holder refused our update" % h.get("from_round"))
            self._answered()
            self._keep_evidence(h.get("from_round"))
        if self.held and new.digest != h.get("prev"):
            self._before_last = st.theta
        if late:
            self.stats["late"] += 1
        steps = max(0, self.H - int(h.get("progress", 0)))
        return Sync(new.theta.copy(), new.round, steps, new.stop, "late" if late else "update")

    def _keep_evidence(self, r):
        """Saves the refused round r's evidence (evidence.py) where the node
        asked, for an appeal; a failure to is logged, not fatal."""
        sent = self._sent
        if not self.evidence_dir or sent is None or sent[0] != r:
            return
        try:
            evidence.save(self.evidence_dir, r, sent[1], self._before_last, sent[2], sent[3],
                          self.model_description)
        except (OSError, ValueError) as e:
            self._log("cannot keep the evidence of refused round %d: %s" % (r, e))

    def _answered(self):
        """Tells this worker's node the round answers so far (its progress
        file): accepted, refused, and refused in a row."""
        try:
            progress.answers(self.stats["rounds"], self.stats["refused"], self.stats["refused_run"])
        except OSError as e:
            self._log("cannot report the round answers to the node: %s" % e)

    def _adopt(self, h, p, outcome):
        """Replaces our state with a peer's full state (theta and momentum)."""
        n = self._n
        if len(p) != 8 * n:
            raise ValueError("state of %d bytes, expected %d" % (len(p), 8 * n))
        flat = np.frombuffer(p, dtype="<f4").astype(np.float32)
        new = _State(round=int(h["round"]), theta=flat[:n].copy(), mom=flat[n:].copy(), stop=bool(h.get("stop")),
                     steps=int(h.get("steps", 0)), contrib=dict(h.get("contrib") or {})).seal()
        if new.digest != h.get("digest"):
            raise ValueError("state digest %s, peer said %s" % (new.digest, h.get("digest")))
        with self._cv:
            self._state = new
            self._members = set(h.get("members") or []) | {self.rank}
            self._coord = h.get("coord", h.get("rank"))
            self._dead.discard(self._coord)
        if outcome is None:
            return None
        self.stats["resyncs"] += 1
        steps = max(0, self.H - int(h.get("progress", 0)))
        self._log("resynced to round %d (digest %s) from rank %s" % (new.round, new.digest, h.get("rank")))
        return Sync(new.theta.copy(), new.round, steps, new.stop, outcome)

    def _gone(self, c, why):
        """Marks rank c gone and picks the lowest live member to coordinate."""
        self._drop_link()
        with self._cv:
            self._dead.add(c)
            if self._coord == c:
                live = [m for m in self._members | {self.rank} if m not in self._dead]
                self._coord = min(live)
                self._log("%s: rank %d coordinates round %d" % (why, self._coord, self._state.round))

    # ------------------------------------------------------------ client side

    def _header(self, h):
        st = self._state
        h.update(rank=self.rank, job=self.job, round=st.round, digest=st.digest, n=self._n)
        return h

    def _push(self, c, delta, steps, stop):
        """Sends our delta to coordinator c; returns its answer (waits through keepalives)."""
        h = {"t": "push", "steps": steps, "stop": bool(stop) or self._state.stop}
        payload = b""
        if delta is not None:
            meta, payload = codecs.encode(delta, self.codec)
            h.update(meta)
            proof = self._proofs.get(self._state.round) if self.held else None
            if proof is not None:
                h["commit"] = {"state": proof[1], "cursor": proof[2]}
            if self.held and self.evidence_dir:
                st = self._state
                self._sent = (st.round, st.theta, codecs.decode(meta, payload), steps)
        return self._request(c, h, payload, reuse=True)

    def _request(self, j, h, payload=b"", reuse=False):
        """One request and its answer. reuse: over our persistent link to j
        (reconnecting once if it went stale); else over a fresh connection."""
        self._header(h)
        for attempt in (0, 1):
            fresh = True
            if reuse and self._link and self._link[0] == j:
                sock, fresh = self._link[1], False
            else:
                if reuse:
                    self._drop_link()
                sock = wire.dial(self.peers.addrs[j], self.connect_timeout)
                if reuse:
                    self._link = (j, sock)
            try:
                self._send(sock, h, payload)
                sock.settimeout(self.connect_timeout if h["t"] == "hello" else SILENCE)
                while True:
                    rh, rp, nb = wire.recv(sock)
                    self._count(0, nb)
                    if rh["t"] != "wait":
                        break
                if rh["t"] == "error":
                    raise wire.ProtocolError("rank %d refused: %s" % (j, rh.get("msg")))
                if not reuse:
                    self._send(sock, {"t": "bye", "leaving": False})
                    sock.close()
                return rh, rp
            except (OSError, EOFError, wire.ProtocolError):
                if reuse:
                    self._drop_link()
                else:
                    sock.close()
                if fresh or attempt:
                    raise

    def _drop_link(self):
        if self._link:
            try:
                self._link[1].close()
            except OSError:
                pass
            self._link = None

    def _send(self, sock, h, payload=b""):
        self._count(wire.send(sock, h, payload), 0)

    def _count(self, sent, got):
        with self._io:
            self.stats["bytes_sent"] += sent
            self.stats["bytes_received"] += got

    # ------------------------------------------------------------ server side

    def _serve(self):
        bound = getattr(self.peers, "rank_addrs", None)
        if bound:  # the holder on the network: one port per worker rank
            for j, addr in enumerate(bound):
                self._listen(addr, j)
            return
        self._listen(self.peers.addrs[self.rank], None)

    def _listen(self, addr, rank):
        """Listens on addr; rank: every connection there speaks for that rank only."""
        host, port = wire.split_addr(addr)
        bind = host if host in ("127.0.0.1", "localhost", "::1") else ""
        ls = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            ls.bind((bind, port))
        except OSError as e:
            ls.close()
            raise OSError("cannot listen on %s for averaging: %s" % (addr, e)) from e
        ls.listen(64)
        self._listener = ls
        self._listeners.append(ls)
        self._spawn(self._accept_loop, ls, rank)

    def _stop_server(self):
        # shutdown() first: close() alone leaves a thread blocked in accept()
        # or recv() holding the socket open (and the port taken).
        for s in self._listeners + list(self._socks):
            for op in (lambda: s.shutdown(socket.SHUT_RDWR), s.close):
                try:
                    op()
                except OSError:
                    pass

    def _spawn(self, fn, *args):
        th = threading.Thread(target=fn, args=args, daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [th]
        th.start()

    def _accept_loop(self, ls, rank=None):
        while True:
            try:
                sock, _ = ls.accept()
            except OSError:
                return
            if self._closing:
                sock.close()
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks.add(sock)
            self._spawn(self._conn_loop, sock, rank)

    def _conn_loop(self, sock, bound=None):
        peer, abrupt = None, True
        try:
            while True:
                h, p, nb = wire.recv(sock)
                self._count(0, nb)
                # The first frame names the peer; later ones may not change it.
                j = h.get("rank", peer)
                if (h.get("job", self.job) != self.job or not isinstance(j, int) or not 0 <= j < self.world
                        or j == self.rank or (peer is not None and j != peer) or (bound is not None and j != bound)):
                    self._send(sock, {"t": "error", "msg": "not a peer of this job (job %r rank %r)" % (h.get("job"), j)})
                    return
                if h.get("n", self._n) != self._n:
                    self._send(sock, {"t": "error", "msg": "model has %s weights, ours %d" % (h.get("n"), self._n)})
                    self._log("rank %d has a model of %s weights, ours has %d: refused" % (j, h.get("n"), self._n))
                    return
                if peer is None:
                    peer = j
                    with self._cv:
                        self._conns[j] = self._conns.get(j, 0) + 1
                        self._dead.discard(j)
                t = h["t"]
                if t == "hello":
                    self._on_hello(sock, j, h)
                elif t == "push":
                    self._on_push(sock, j, h, p)
                elif t == "proof":
                    self._on_proof(sock, j, h, p)
                elif t == "bye":
                    abrupt = False
                    if h.get("leaving"):
                        with self._cv:
                            self._dead.add(j)
                            self._members.discard(j)
                            self._cv.notify_all()
                    return
                else:
                    self._send(sock, {"t": "error", "msg": "unknown frame type %r" % t})
                    return
        except (OSError, EOFError, ValueError, wire.ProtocolError):
            pass
        finally:
            self._socks.discard(sock)
            sock.close()
            if peer is not None:
                with self._cv:
                    self._conns[peer] -= 1
                    if abrupt and self._conns[peer] == 0 and not self._closing:
                        self._dead.add(peer)
                        self._cv.notify_all()

    def _state_reply(self, want_state):
        """Our state's header (and theta||momentum when asked); caller holds _cv."""
        st = self._state
        h = {"t": "state", "rank": self.rank, "job": self.job, "round": st.round, "digest": st.digest,
             "established": self._established, "progress": int(self.progress), "stop": st.stop,
             "steps": st.steps, "contrib": st.contrib, "coord": self._coord,
             "members": sorted(self._members), "n": self._n, "has_state": bool(want_state)}
        payload = b""
        if want_state:
            payload = st.theta.astype("<f4").tobytes() + st.mom.astype("<f4").tobytes()
        return h, payload

    def _on_hello(self, sock, j, h):
        with self._cv:
            want = bool(h.get("want_state")) and self._established
            if h.get("join") and self._established and self._coord == self.rank:
                self._members.add(j)
                self._lagging.discard(j)
            rh, rp = self._state_reply(want)
        self._send(sock, rh, rp)

    def _on_push(self, sock, j, h, p):
        r = h.get("round")
        if not isinstance(r, int):
            raise wire.ProtocolError("push without a round")
        # A member that already has the previous round's update (we are its
        # next coordinator) is ahead of us by a hair: wait until we have it too.
        if not self._await(sock, lambda: r <= self._state.round, limit=self.timeout):
            return self._send(sock, {"t": "bye", "leaving": False})
        with self._cv:
            st = self._state
            if r < st.round:  # late: the update it missed, or our whole state
                self._lagging.discard(j)
                self._members.add(j)
                res = self._results.get(r)
                if res and r == st.round - 1 and res[0] == h.get("digest"):
                    reply = (dict(res[1], progress=int(self.progress)), res[2])
                else:
                    reply = self._state_reply(self._established)
                return self._send(sock, *reply)
            coord = self._coord
        if coord != self.rank:
            coord = self._check_coordinator(coord)
            if coord != self.rank:
                return self._send(sock, {"t": "redirect", "to": coord})
        try:
            delta = codecs.decode(h, p) if h.get("steps", 0) > 0 else None
        except ValueError as e:
            return self._send(sock, {"t": "error", "msg": "bad delta: %s" % e})
        if delta is not None and delta.size != self._n:
            return self._send(sock, {"t": "error", "msg": "delta has %d weights, ours %d" % (delta.size, self._n)})
        if delta is not None:
            delta, why = self._vet(j, r, delta, h, p)
            if delta is None and why.startswith("dropped"):
                return self._send(sock, {"t": "error", "msg": why})
        with self._cv:
            st = self._state
            if st.round != r or h.get("digest") != st.digest or not self._established:
                # The round closed meanwhile, or the member's copy is not ours.
                res = self._results.get(r)
                if res and st.round == r + 1 and res[0] == h.get("digest"):
                    reply = (dict(res[1], progress=int(self.progress)), res[2])
                else:
                    reply = self._state_reply(self._established)
                return self._send(sock, *reply)
            self._pending[j] = (delta, int(h.get("steps", 0)), bool(h.get("stop")))
            self._members.add(j)
            self._lagging.discard(j)
            self._cv.notify_all()
        if not self._await(sock, lambda: r in self._results):
            return self._send(sock, {"t": "bye", "leaving": True})
        with self._cv:
            _, rh, rp = self._results[r]
        self._send(sock, self._answer(j, rh), rp)

    def _answer(self, j, h):
        """The round's update header as sent to rank j (the holder adds the
        round it wants j to prove, if any)."""
        return h

    def _on_proof(self, sock, j, h, p):
        self._send(sock, {"t": "error", "msg": "rank %d holds no spot checks" % self.rank})

    def _check_coordinator(self, coord):
        """We are asked to coordinate a round we think coord has: if coord
        does not answer, take over (lowest live member); returns who coordinates."""
        try:
            self._request(coord, {"t": "hello"})
            return coord
        except (OSError, EOFError, ValueError, wire.ProtocolError):
            pass
        with self._cv:
            self._dead.add(coord)
            if self._coord == coord:
                self._coord = min(m for m in self._members | {self.rank} if m not in self._dead)
                self._log("rank %d does not answer: rank %d coordinates round %d"
                          % (coord, self._coord, self._state.round))
            return self._coord

    def _await(self, sock, done, limit=None):
        """Waits until done() (checked under _cv), sending keepalives to sock;
        False when we are closing or `limit` seconds passed first."""
        end = None if limit is None else time.monotonic() + limit
        while True:
            with self._cv:
                if done():
                    return True
                if self._closing or (end is not None and time.monotonic() > end):
                    return False
                self._cv.wait(KEEPALIVE)
                if done():
                    return True
            self._send(sock, {"t": "wait"})

    # ------------------------------------------------------------ checkpoints

    def _remove_checkpoint(self):
        if self.checkpoint_dir:
            try:
                os.remove(os.path.join(self.checkpoint_dir, CHECKPOINT))
            except FileNotFoundError:
                pass

    def _save_checkpoint(self):
        if not self.checkpoint_dir or self._state is None:
            return
        st = self._state
        meta = {"round": st.round, "digest": st.digest, "stop": st.stop, "steps": st.steps,
                "contrib": st.contrib, "n": self._n, "rank": self.rank, "time": time.time()}
        os.makedirs(self.checkpoint_dir, exist_ok=True)
        path = os.path.join(self.checkpoint_dir, CHECKPOINT)
        tmp = path + ".tmp.npz"
        np.savez(tmp, theta=st.theta, mom=st.mom, meta=np.array(json.dumps(meta)))
        os.replace(tmp, path)

    def _load_checkpoint(self):
        if not self.checkpoint_dir:
            return None
        path = os.path.join(self.checkpoint_dir, CHECKPOINT)
        if not os.path.isfile(path):
            return None
        try:
            with np.load(path) as z:
                meta = json.loads(str(z["meta"]))
                theta, mom = z["theta"].astype(np.float32), z["mom"].astype(np.float32)
        except (OSError, ValueError, KeyError) as e:
            self._log("ignoring the checkpoint %s: %s" % (path, e))
            return None
        if theta.size != self._n or mom.size != self._n:
            self._log("ignoring the checkpoint %s: %d weights, the model has %d" % (path, theta.size, self._n))
            return None
        st = _State(round=int(meta["round"]), theta=theta, mom=mom, stop=bool(meta.get("stop")),
                    steps=int(meta.get("steps", 0)), contrib=dict(meta.get("contrib") or {})).seal()
        if st.digest != meta.get("digest"):
            self._log("ignoring the checkpoint %s: its digest does not match" % path)
            return None
        return st


def _holder_failure(e):
    """Why a request to the holder failed, to try again; raises Dropped
    when the holder dropped us (no use trying again)."""
    if isinstance(e, wire.ProtocolError) and "dropped" in str(e):
        raise Dropped(str(e)) from None
    return _why(e)


def _why(e):
    return "%s: %s" % (type(e).__name__, e) if str(e) else type(e).__name__
