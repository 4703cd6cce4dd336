"""The model's holder: DiLoCo's outer loop on the job's submitter.

In held mode (averager.py) the submitter's node runs one more rank, the
holder. It keeps the global weights; every worker pushes its
pseudo-gradient to it alone, and it averages only the ones it accepted.
A worker's delta is refused when:

  - it is not finite (NaN or infinite values);
  - it is empty (a worker that trained nothing, or says it did);
  - its norm is over `norm_factor` times the median of the deltas accepted
    in the last rounds (a scaled update);
  - it repeats the last global update (cosine similarity above `echo`): a
    worker that trained nothing and hands back what everyone received;
  - the worker's model, theta - delta, has a loss on the holder's own
    validation batch worse than theta's by more than `tolerance` (relative):
    `check(theta)` returns that loss; it is the job's own code, run by the
    submitter on its own data.

A worker whose deltas are refused `drop_after` rounds in a row is dropped:
its next push is answered with an error and it fails (averager.Dropped).

The holder keeps accounts per rank: rounds accepted and refused, and the
seconds of its accepted rounds (from the round's start to its push, at most
twice the round's low median: a worker that holds its update back is not
paid for the wait), which is what the worker is paid for. `accounts()` returns them; `write_accounts`
writes them where the node reads them.

What it does not guarantee: a worker that trains on other data than it was
given, or fewer steps than it says, is accepted as long as its update helps
the validation loss; the check catches updates that do not help, not work
that was done differently.
"""

import json
import os
import statistics
import threading
import time
from collections import deque

import numpy as np

from .averager import Averager, Sync


class Holder(Averager):
    """Holder(peers, sync_every, check=fn, ...) runs the holder's rank.

    peers.rank must be peers.holder. check(theta) -> validation loss (None:
    no loss check; the cheap checks still apply unless checks=False).
    tolerance (0.1): a delta is refused if the loss of theta - delta is over
    loss(theta) * (1 + tolerance); norm_factor (10); echo (0.98); drop_after
    (3 refused rounds in a row); pay_cap (2: an accepted round is accounted
    at most twice the round's low median time, so that a worker holding its
    delta back is not paid for the wait); the rest as Averager (timeout: how long a
    round waits for a silent worker after the round's start).

    start(theta, trainable) opens the server; next_round() closes the next round
    (waiting for the workers' deltas) and returns its Sync, or None once no
    worker is left; request_stop() makes the next round tell every worker
    to stop; close() ends it.
    """

    def __init__(self, peers, sync_every, check=None, checks=True, tolerance=0.1, norm_factor=10.0, echo=0.98,
                 drop_after=3, pay_cap=2.0, **kw):
        if peers.holder is None or peers.rank != peers.holder:
            raise ValueError("the holder runs as the holder's rank (%r), not rank %d" % (peers.holder, peers.rank))
        super().__init__(peers, sync_every, **kw)
        self.check = check if checks else None
        self.checks = bool(checks)
        self.tolerance, self.norm_factor, self.echo = float(tolerance), float(norm_factor), float(echo)
        self.drop_after = int(drop_after)
        self.pay_cap = float(pay_cap)
        self._check_lock = threading.Lock()
        self._base = (None, None)             # (digest, loss of theta) for the open round
        self._norms = deque(maxlen=3 * max(1, peers.world - 1))
        self._last_avg = None                 # the last global update (decoded average)
        self._round_start = time.monotonic()
        self._verdicts = {}                   # rank -> (round, accepted, why, seconds) for the open round
        self._accounts = {}                   # rank -> dict
        self._streak = {}                     # rank -> refused rounds in a row
        self._dropped = set()
        self.check_seconds = 0.0              # time spent in check(), all rounds

    def start(self, theta, trainable=None):
        res = super().start(theta, trainable)
        self._round_start = time.monotonic()
        self._prepare_base()
        return res

    def next_round(self):
        """Closes the open round; None once every worker left or was dropped."""
        with self._cv:
            live = [m for m in self._members if m != self.rank and m not in self._dead]
            if not live and not self._expect_until:
                return None
        res = self._coordinate(None, 0, False)
        self._prepare_base()
        return res

    def accounts(self):
        """Per rank: rounds accepted and refused, seconds of the accepted
        rounds, the last refusal's reason, whether it was dropped."""
        with self._cv:
            return {str(j): dict(a) for j, a in sorted(self._accounts.items())}

    def write_accounts(self, path):
        """Writes accounts() (and the holder's round and check time) to path, atomically."""
        doc = {"round": self.round, "check_seconds": round(self.check_seconds, 3), "workers": self.accounts()}
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
        os.replace(tmp, path)

    # ------------------------------------------------------------ checks

    def _prepare_base(self):
        """The loss of the round's theta, computed while the workers train."""
        if self.check is None:
            return
        st = self._state
        with self._check_lock:
            if self._base[0] != st.digest:
                t = time.monotonic()
                self._base = (st.digest, float(self.check(st.theta)))
                self.check_seconds += time.monotonic() - t

    def _vet(self, j, r, delta):
        now = time.monotonic()
        with self._cv:
            if j in self._dropped:
                return None, "dropped: %d updates refused in a row" % self.drop_after
            st, last = self._state, self._last_avg
            if r != st.round:
                return delta, ""  # the round closed meanwhile: the push is answered as late, not averaged
            seconds = now - self._round_start
            norms = list(self._norms)
        ok, why = True, ""
        if self.checks:
            ok, why = self._judge(st, delta, norms, last)
        with self._cv:
            a = self._account(j)
            self._verdicts[j] = (r, ok, why, seconds, float(np.linalg.norm(delta)) if ok else 0.0)
            if not ok:
                a["last_refusal"] = "round %d: %s" % (r, why)
                self._log("round %d: refused rank %d's update: %s" % (r, j, why))
        return (delta, "") if ok else (None, why)

    def _judge(self, st, delta, norms, last):
        if not np.isfinite(delta).all():
            return False, "not finite"
        n = float(np.linalg.norm(delta))
        if n == 0.0:
            return False, "an empty update"
        if len(norms) >= 2:
            med = statistics.median(norms)
            if med > 0 and n > self.norm_factor * med:
                return False, "norm %.3g, over %g times the median %.3g" % (n, self.norm_factor, med)
        if last is not None:
            ln = float(np.linalg.norm(last))
            if ln > 0 and float(np.dot(delta, last)) / (n * ln) > self.echo:
                return False, "it repeats the last global update"
        if self.check is None:
            return True, ""
        with self._check_lock:
            t = time.monotonic()
            if self._base[0] != st.digest:
                self._base = (st.digest, float(self.check(st.theta)))
            base = self._base[1]
            loss = float(self.check(st.theta - delta))
            self.check_seconds += time.monotonic() - t
        if not np.isfinite(loss) or loss > base + self.tolerance * abs(base):
            return False, "validation loss %.4g from %.4g (tolerance %g%%)" % (loss, base, 100 * self.tolerance)
        return True, ""

    def _account(self, j):
        return self._accounts.setdefault(j, {"accepted": 0, "refused": 0, "seconds": 0.0, "last_refusal": "",
                                             "dropped": False})

    def _closed(self, r, got, refused, header):
        accepted = {j for j, _, _ in got}
        # A worker that holds its delta back to be paid for more time gets
        # at most pay_cap times the round's (low) median accepted time.
        times = [v[3] for j, v in self._verdicts.items() if j in accepted and v[0] == r]
        cap = self.pay_cap * statistics.median_low(times) if len(times) >= 2 else None
        for j in accepted | set(refused):
            v = self._verdicts.get(j)
            a = self._account(j)
            if j in accepted:
                a["accepted"] += 1
                if v and v[0] == r:
                    a["seconds"] = round(a["seconds"] + (v[3] if cap is None else min(v[3], cap)), 3)
                    self._norms.append(v[4])
                self._streak[j] = 0
            else:
                a["refused"] += 1
                self._streak[j] = self._streak.get(j, 0) + 1
                if self._streak[j] >= self.drop_after:
                    self._dropped.add(j)
                    self._dead.add(j)
                    self._members.discard(j)
                    a["dropped"] = True
                    self._log("rank %d dropped: %d updates refused in a row" % (j, self._streak[j]))
        self._verdicts = {}
        self._round_start = time.monotonic()

    def _coordinate(self, delta, steps, stop):
        before = self._state.theta
        res = super()._coordinate(delta, steps, stop)
        # The last global update, as every worker received it (for the echo check).
        moved = before - self._state.theta
        with self._cv:
            self._last_avg = moved if np.any(moved) else self._last_avg
        return res

    def close(self, finished=False):
        # The workers that missed a round's deadline are not waited for.
        with self._cv:
            self._dead |= self._lagging
        super().close(finished)

    def _on_hello(self, sock, j, h):
        if j in self._dropped:
            return self._send(sock, {"t": "error", "msg": "dropped: %d updates refused in a row" % self.drop_after})
        return super()._on_hello(sock, j, h)


__all__ = ["Holder", "Sync"]
