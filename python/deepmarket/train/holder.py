"""The model's holder: DiLoCo's outer loop on the job's submitter.

In held mode (averager.py) the submitter's node runs one more rank, the
holder. It keeps the global weights; every worker pushes its
pseudo-gradient to it alone, and it averages only the ones it accepted.
A worker's delta is refused when:

  - it is not finite (NaN or infinite values);
  - it is empty (a worker that trained nothing, or says it did);
  - its norm is over `norm_factor` times the median of the deltas accepted
    in the last rounds (a scaled update);
  - its norm is under 1/`norm_factor` of that median, for the steps it
    says it took (a faint update: noise dressed as work);
  - it repeats the last global update (cosine similarity above `echo`): a
    worker that trained nothing and hands back what everyone received;
  - it leans on the last global update (cosine similarity above
    `residual`) and the rest of it, its residual (the delta less its
    projection on that update), is not work of its own: faint (as above),
    or, with `check`, the residual alone does not lower the validation
    loss. A worker that echoes the last update turned just under `echo`,
    with noise for the rest, is refused so;
  - it duplicates another worker's delta of the same round (cosine
    similarity above `duplicate`): a worker that hands in a partner's
    update as its own. The deltas go to the holder alone, so a copy takes
    collusion, and the holder cannot tell who copied whom: every delta of
    the duplicates is refused, the one accepted first in the round too;
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

What the checks alone do not guarantee: a worker that trains on other
data than it was given, or fewer steps than it says, is accepted as long as
its update helps the validation loss; they catch updates that do not help,
not work that was done differently. Nor do they catch noise at the scale
of honest updates once training has flattened out (honest updates no
longer help either), an echo turned further than `residual` from the last
update included (it is judged as a whole). `residual` is high (0.9)
because an honest delta on a steady slope leans on the last update too,
and the rest of it, mostly its batches' noise, need not lower the loss
alone: at 0.5, test_holder's honest workers (plain gradient steps on a
linear model, cosine up to 0.94 with the last update) have rounds
refused; the Fashion-MNIST example's Keras workers stay near 0.1 to 0.4.
The duplicate check lets a worker get another refused only by computing
that worker's own update. Spot checks catch work not done:

Spot checks (verify_rate > 0, a job's [verify]): every worker commits to
its state at each round's start (the digest of its inner optimizer's state
and its data cursor, sent with its push). With probability verify_rate the
holder asks a worker to prove an accepted round: the worker sends that
state, the holder checks it against the commitment, and `replay(theta,
state, rank, cursor, steps)` (the job's code) takes the round's inner steps
again from the round's global weights on the worker's own batches. The
update passes when it is within verify_tolerance (relative L2 error) of the
replayed one. A worker that fails a check, sends a state other than the one
it committed, or leaves a check unanswered past its next round forfeits
all its pay for the job and is dropped. Until a worker has passed a check,
verify_share of its pay is held back (an honest worker never checked keeps
that share out). The holder keeps a hash chain of each worker's
commitments and updates (accounts' "chain"). A check costs the holder one
worker round of compute, in the background; verify_rate 0.1 adds a tenth of
one worker's training to the submitter's machine. It proves the steps were
taken from the committed state on the batches the job gave that worker; it
does not prove the committed state came from honest earlier rounds (each
round is checked from its own start), and a round never checked is paid
unproven.
"""

import hashlib
import json
import os
import queue
import random
import statistics
import threading
import time
from collections import deque

import numpy as np

from .averager import Averager, Sync
from .evidence import digest


# The thresholds' defaults: the node's (p2p.DefaultChecks).
CHECK_DEFAULTS = {"tolerance": 0.1, "norm_factor": 10.0, "echo": 0.98, "residual": 0.9, "duplicate": 0.98}


def bid_checks(environ):
    """The thresholds the job's signed bid names (DM_CHECK_*, set by the
    node in a held job): {name: value} for those given."""
    out = {}
    for name in CHECK_DEFAULTS:
        v = environ.get("DM_CHECK_" + name.upper())
        if v:
            try:
                out[name] = float(v)
            except ValueError:
                raise ValueError("DM_CHECK_%s=%r: want a number" % (name.upper(), v))
    return out


def validation_batch(environ=None):
    """The validation batch the job's bid names by content address, as the
    node placed it for the holder (DM_VALIDATION, the file the node fetched
    by DM_VALIDATION_CID): the arrays of its .npz, {name: array}; None when
    the bid names none. A referee recomputing a contested check loads the
    same bytes."""
    env = os.environ if environ is None else environ
    path = env.get("DM_VALIDATION")
    if not path:
        if env.get("DM_VALIDATION_CID"):
            raise ValueError("the bid names validation batch %s but the node gave no DM_VALIDATION" % env["DM_VALIDATION_CID"])
        return None
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


class Holder(Averager):
    """Holder(peers, sync_every, check=fn, ...) runs the holder's rank.

    peers.rank must be peers.holder. check(theta) -> validation loss (None:
    no loss check; the cheap checks still apply unless checks=False).
    The thresholds below are the job's signed bid's when it names them
    (DM_CHECK_*, [training.checks] in its spec), then those given, then the
    defaults (CHECK_DEFAULTS). tolerance (0.1): a delta is refused if the loss of theta - delta is over
    loss(theta) * (1 + tolerance); norm_factor (10); echo (0.98); residual
    (0.9: a delta whose cosine similarity with the last global update is
    over it must do work beyond that update: its residual, the delta less
    its projection on the update, is refused when faint or, with check,
    when loss(theta - residual) >= loss(theta)); duplicate (0.98: deltas of
    one round more alike than this are all refused); drop_after
    (3 refused rounds in a row); pay_cap (2: an accepted round is accounted
    at most twice the round's low median time, so that a worker holding its
    delta back is not paid for the wait); the rest as Averager (timeout: how long a
    round waits for a silent worker after the round's start).

    start(theta, trainable) opens the server; next_round() closes the next round
    (waiting for the workers' deltas) and returns its Sync, or None once no
    worker is left; request_stop() makes the next round tell every worker
    to stop; close() ends it.
    """

    def __init__(self, peers, sync_every, check=None, checks=True, tolerance=None, norm_factor=None, echo=None,
                 residual=None, duplicate=None, drop_after=3, pay_cap=2.0, verify_rate=0.0, verify_share=0.2,
                 verify_tolerance=0.1, replay=None, environ=None, **kw):
        if peers.holder is None or peers.rank != peers.holder:
            raise ValueError("the holder runs as the holder's rank (%r), not rank %d" % (peers.holder, peers.rank))
        super().__init__(peers, sync_every, **kw)
        self.check = check if checks else None
        self.checks = bool(checks)
        terms = bid_checks(os.environ if environ is None else environ)
        given = {"tolerance": tolerance, "norm_factor": norm_factor, "echo": echo, "residual": residual,
                 "duplicate": duplicate}
        for name, v in given.items():
            if name in terms and v is not None and float(v) != terms[name]:
                self._log("the job's bid says %s = %g: it rules over the %g given" % (name, terms[name], float(v)))
        th = dict(CHECK_DEFAULTS)
        th.update({k: float(v) for k, v in given.items() if v is not None})
        th.update(terms)
        self.tolerance, self.norm_factor, self.echo = th["tolerance"], th["norm_factor"], th["echo"]
        self.residual, self.duplicate = th["residual"], th["duplicate"]
        self.validation = (os.environ if environ is None else environ).get("DM_VALIDATION_CID")
        self.drop_after = int(drop_after)
        self.pay_cap = float(pay_cap)
        self._check_lock = threading.Lock()
        self._base = (None, None)             # (digest, loss of theta) for the open round
        self._norms = deque(maxlen=3 * max(1, peers.world - 1))
        self._last_avg = None                 # the last global update (decoded average)
        self._before_last = ""                # the digest of theta before that update
        self.model_digest = ""                # the model description's (evidence.py), when the program gives it
        self._round_start = time.monotonic()
        self._verdicts = {}                   # rank -> (round, accepted, why, seconds, norm) for the open round
        self._deltas = {}                     # rank -> (delta, norm) pushed in the open round (duplicate check)
        self._accounts = {}                   # rank -> dict
        self._streak = {}                     # rank -> refused rounds in a row
        self._dropped = set()
        self.check_seconds = 0.0              # time spent in check(), all rounds
        if not 0.0 <= float(verify_rate) <= 1.0 or not 0.0 <= float(verify_share) <= 1.0:
            raise ValueError("verify_rate and verify_share are shares, 0 to 1")
        if float(verify_rate) > 0 and replay is None:
            raise ValueError("spot checks (verify_rate > 0) need replay(theta, state, rank, cursor, steps)")
        self.verify_rate, self.verify_share = float(verify_rate), float(verify_share)
        self.verify_tolerance, self.replay = float(verify_tolerance), replay
        self.replay_seconds = 0.0             # time spent replaying rounds, all checks
        self._rng = random.SystemRandom()     # which rounds are checked: nothing a worker can predict
        self._open = {}                       # rank -> its open spot check
        self._replays = queue.Queue()
        self._replayer = None

    def start(self, theta, trainable=None):
        if self.verify_rate > 0:
            self._replayer = threading.Thread(target=self._replay_loop, daemon=True, name="replay")
            self._replayer.start()
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
            return {str(j): self._paid(a) for j, a in sorted(self._accounts.items())}

    def _paid(self, a):
        """A worker's accounts as the node reads them: seconds is what it
        is paid for now (0 once it forfeited; its earned seconds less the
        held-back share until it passed a spot check)."""
        out = {k: v for k, v in a.items() if k != "earned"}
        earned = a["earned"]
        held = 0.0
        if a.get("forfeited"):
            held, earned = earned, 0.0
        elif self.verify_rate > 0 and not a.get("checks_passed"):
            held = earned * self.verify_share
        out["seconds"] = round(earned - held if not a.get("forfeited") else 0.0, 3)
        if self.verify_rate > 0:
            out["held_seconds"] = round(held, 3)
        return out

    def write_accounts(self, path):
        """Writes accounts() (and the holder's round and check time) to path, atomically."""
        doc = {"round": self.round, "check_seconds": round(self.check_seconds, 3), "workers": self.accounts(),
               "model": self.model_digest,
               "checks": {"tolerance": self.tolerance, "norm_factor": self.norm_factor, "echo": self.echo,
                          "residual": self.residual, "duplicate": self.duplicate}}
        if self.validation:
            doc["validation"] = self.validation  # the batch's content address, as the bid names it
        if self.verify_rate > 0:
            doc["verify"] = {"rate": self.verify_rate, "share": self.verify_share,
                             "tolerance": self.verify_tolerance, "replay_seconds": round(self.replay_seconds, 3)}
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

    def _vet(self, j, r, delta, h=None, payload=b""):
        now = time.monotonic()
        with self._cv:
            if j in self._dropped:
                return None, self._dropped_why(j)
            st, last = self._state, self._last_avg
            if r != st.round:
                return delta, ""  # the round closed meanwhile: the push is answered as late, not averaged
            seconds = now - self._round_start
            norms = list(self._norms)
            why = ""
            if self.verify_rate > 0:
                why = self._commitment(j, r, (h or {}).get("commit"), payload)
                if why.startswith("dropped"):
                    return None, why
        ok = not (self.verify_rate > 0 and why)
        if self.checks and ok:
            ok, why = self._judge(st, delta, norms, last, int((h or {}).get("steps", self.H)))
        with self._cv:
            a = self._account(j)
            twins = self._twins(j, r, delta, h) if self.checks else []
            if twins and ok:
                ok, why = False, _duplicate_of(twins)
            self._verdicts[j] = (r, ok, why, seconds, float(np.linalg.norm(delta)) if ok else 0.0)
            if not ok:
                a["last_refusal"] = "round %d: %s" % (r, why)
                a["refusal"] = self._bound(r, st, delta)
                self._log("round %d: refused rank %d's update: %s" % (r, j, why))
            elif self.verify_rate > 0 and j not in self._open and self._rng.random() < self.verify_rate:
                commit = h["commit"]
                self._open[j] = {"round": r, "theta": st.theta.copy(), "delta": np.array(delta, dtype=np.float32),
                                 "steps": int(h.get("steps", 0)), "cursor": commit["cursor"],
                                 "state": commit["state"], "proof": None}
            for k in twins:
                self._refuse_twin(k, r, j)
        return (delta, "") if ok else (None, why)

    # ------------------------------------------------------------ duplicates

    def _twins(self, j, r, delta, h):
        """The ranks whose delta of round r is a duplicate of rank j's
        (cosine similarity over `duplicate`); records j's for those pushed
        after it (caller holds _cv). A push the round will not average (the
        round closed, or j's copy of theta is not ours) is left out."""
        st = self._state
        if r != st.round or (h or {}).get("digest") != st.digest:
            return []
        n = float(np.linalg.norm(delta))
        if not (np.isfinite(n) and n > 0):
            return []
        # Every delta of the round counts, a refused one too: a copy of a
        # partner's refused update is no more its own work.
        twins = sorted(k for k, (d, m) in self._deltas.items()
                       if k != j and float(np.dot(delta, d)) / (n * m) > self.duplicate)
        self._deltas[j] = (delta, n)
        return twins

    def _refuse_twin(self, k, r, j):
        """Refuses rank k's delta of round r, vetted before rank j's turned
        out to duplicate it (caller holds _cv): a delta accepted then is
        taken out of the round's average before the round closes."""
        v = self._verdicts.get(k)
        if v is None or v[0] != r or not v[1]:
            return  # refused already: it keeps its reason
        why = _duplicate_of([j])
        self._verdicts[k] = (r, False, why, v[3], 0.0)
        self._account(k)["last_refusal"] = "round %d: %s" % (r, why)
        self._account(k)["refusal"] = self._bound(r, self._state, self._deltas[k][0])
        self._log("round %d: refused rank %d's update: %s" % (r, k, why))
        o = self._open.get(k)
        if o is not None and o["round"] == r:
            self._open.pop(k)  # a round it is not paid for has nothing to prove
        # k's push is stored for the round's average just after its vetting
        # (Averager._on_push): wait for it, then take its delta out. The
        # round cannot close without it (it waits for its members' pushes).
        self._cv.wait_for(lambda: k in self._pending or self._state.round != r, timeout=self.timeout)
        if self._state.round == r and k in self._pending:
            self._pending[k] = (None,) + tuple(self._pending[k][1:])

    # ------------------------------------------------------------ spot checks

    def _commitment(self, j, r, commit, payload):
        """Records rank j's commitment for round r in its chain (caller
        holds _cv); returns why its push is refused ("" if it is not). A
        spot check left unanswered past the round after it fails the worker."""
        o = self._open.get(j)
        if o is not None and o["proof"] is None and r >= o["round"] + 2:
            return self._fail(j, "it did not answer the spot check of round %d" % o["round"])
        if not (isinstance(commit, dict) and isinstance(commit.get("state"), str) and len(commit["state"]) == 64
                and isinstance(commit.get("cursor"), int) and commit["cursor"] >= 0):
            return "no commitment to its state (spot checks are on)"
        a = self._account(j)
        link = "%d:%d:%s:%s" % (r, commit["cursor"], commit["state"], hashlib.sha256(payload).hexdigest())
        a["chain"] = hashlib.sha256((a.get("chain", "") + link).encode()).hexdigest()
        return ""

    def _answer(self, j, h):
        with self._cv:
            o = self._open.get(j)
            if o is not None and o["proof"] is None and o["round"] >= h.get("from_round", 0) - 1:
                return dict(h, check=o["round"])
        return h

    def _on_proof(self, sock, j, h, p):
        rc = h.get("for_round")
        with self._cv:
            o = self._open.get(j)
            if o is None or o["round"] != rc or o["proof"] is not None:
                return self._send(sock, {"t": "error", "msg": "no spot check of round %r is open" % rc})
            if hashlib.sha256(p).hexdigest() != o["state"]:
                why = self._fail(j, "its state for round %d is not the one it committed" % rc)
                return self._send(sock, {"t": "error", "msg": why})
            o["proof"] = bytes(p)
        self._replays.put(j)
        self._send(sock, {"t": "ok"})

    def _replay_loop(self):
        while True:
            j = self._replays.get()
            if j is None:
                return
            with self._cv:
                o = self._open.get(j)
            if o is None:
                continue
            t = time.monotonic()
            try:
                local = np.asarray(self.replay(o["theta"], o["proof"], j, o["cursor"], o["steps"]), dtype=np.float32)
                replayed = o["theta"] - local.ravel()
                err = float(np.linalg.norm(o["delta"] - replayed)) / max(float(np.linalg.norm(replayed)), 1e-12)
                why = "" if np.isfinite(err) and err <= self.verify_tolerance else \
                    "round %d does not replay: its update is %.3g away from the %d steps' (tolerance %g)" % (
                        o["round"], err, o["steps"], self.verify_tolerance)
            except Exception as e:  # a state that is not one: the worker's doing
                err, why = float("nan"), "round %d could not be replayed from its state: %s" % (o["round"], e)
            dt = time.monotonic() - t
            with self._cv:
                self.replay_seconds += dt
                a = self._account(j)
                if why:
                    self._fail(j, why)
                else:
                    a["checks_passed"] = a.get("checks_passed", 0) + 1
                    self._open.pop(j, None)
                    self._log("round %d: rank %d's spot check passed (%d steps replayed in %.1fs, error %.3g)"
                              % (o["round"], j, o["steps"], dt, err))

    def _fail(self, j, why):
        """Rank j failed a spot check (caller holds _cv): it forfeits its pay
        and is dropped. Returns the reason its pushes get from now on."""
        a = self._account(j)
        self._open.pop(j, None)
        if not a.get("forfeited"):
            a.update(forfeited=True, check_failure=why, dropped=True)
            self._log("rank %d failed a spot check and forfeits its pay: %s" % (j, why))
        self._dropped.add(j)
        self._dead.add(j)
        self._members.discard(j)
        self._cv.notify_all()
        return "dropped: " + why

    def _judge(self, st, delta, norms, last, steps):
        if not np.isfinite(delta).all():
            return False, "not finite"
        n = float(np.linalg.norm(delta))
        if n == 0.0:
            return False, "an empty update"
        floor = 0.0
        if len(norms) >= 2:
            med = statistics.median(norms)
            if med > 0 and n > self.norm_factor * med:
                return False, "norm %.3g, over %g times the median %.3g" % (n, self.norm_factor, med)
            # A faint update (noise dressed as work) helps nothing and
            # harms nothing: the loss check lets it through, this does not.
            floor = med / self.norm_factor * min(1.0, steps / self.H)
            if n < floor:
                return False, "norm %.3g, under 1/%g of the median %.3g for %d steps" % (n, self.norm_factor, med, steps)
        rest = None
        if last is not None:
            ln = float(np.linalg.norm(last))
            cos = float(np.dot(delta, last)) / (n * ln) if ln > 0 else 0.0
            if cos > self.echo:
                return False, "it repeats the last global update"
            if cos > self.residual:
                # The last update turned a little (noise for the rest)
                # passes the echo check, and its echo helps the loss: the
                # part that is not the last update must be work of its own.
                rest = delta - np.float32(float(np.dot(delta, last)) / (ln * ln)) * last
                rn = float(np.linalg.norm(rest))
                if rn < floor:
                    return False, "it leans on the last global update (cosine %.3f) and the rest of it is faint " \
                                  "(norm %.3g, under %.3g)" % (cos, rn, floor)
        if self.check is None:
            return True, ""
        base, loss = self._loss(st, st.theta - delta)
        if not np.isfinite(loss) or loss > base + self.tolerance * abs(base):
            return False, "validation loss %.4g from %.4g (tolerance %g%%)" % (loss, base, 100 * self.tolerance)
        if rest is not None:
            _, loss = self._loss(st, st.theta - rest)
            if not loss < base:
                return False, "it leans on the last global update (cosine %.3f) and the rest of it does not " \
                              "lower the validation loss (%.4g from %.4g)" % (cos, loss, base)
        return True, ""

    def _loss(self, st, theta):
        """(loss of the round's theta, loss of theta): check() calls, one at
        a time, timed in check_seconds."""
        with self._check_lock:
            t = time.monotonic()
            if self._base[0] != st.digest:
                self._base = (st.digest, float(self.check(st.theta)))
            loss = float(self.check(theta))
            self.check_seconds += time.monotonic() - t
            return self._base[1], loss

    def _bound(self, r, st, delta):
        """What a refusal of round r names, for the payer's signed answer
        and the referees: the digests of the round's theta, of theta before
        the last update (the echo check's), of the update refused, and of
        the model's description (evidence.py)."""
        return {"round": int(r), "theta": st.digest, "prev": self._before_last if self._last_avg is not None else "",
                "update": digest(delta), "model": self.model_digest}

    def _account(self, j):
        a = self._accounts.get(j)
        if a is None:
            a = self._accounts[j] = {"accepted": 0, "refused": 0, "earned": 0.0, "last_refusal": "", "dropped": False}
            if self.verify_rate > 0:
                a.update(checks_passed=0, forfeited=False, check_failure="", chain="")
        return a

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
                    a["earned"] = round(a["earned"] + (v[3] if cap is None else min(v[3], cap)), 3)
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
        self._deltas = {}
        self._round_start = time.monotonic()

    def _coordinate(self, delta, steps, stop):
        before = self._state.theta
        res = super()._coordinate(delta, steps, stop)
        # The last global update, as every worker received it (for the echo check).
        moved = before - self._state.theta
        with self._cv:
            if np.any(moved):
                self._last_avg, self._before_last = moved, digest(before)
        return res

    def close(self, finished=False):
        # The workers that missed a round's deadline are not waited for.
        with self._cv:
            self._dead |= self._lagging
        super().close(finished)
        if self._replayer is not None:  # the checks asked and answered finish
            self._replays.put(None)
            self._replayer.join(timeout=max(60.0, 2 * self.timeout))

    def _dropped_why(self, j):
        """Why rank j was dropped, or "" if it was not."""
        with self._cv:
            if j not in self._dropped:
                return ""
            return "dropped: " + (self._account(j).get("check_failure")
                                  or "%d updates refused in a row" % self.drop_after)

    def _on_hello(self, sock, j, h):
        why = self._dropped_why(j)
        if why:
            return self._send(sock, {"t": "error", "msg": why})
        return super()._on_hello(sock, j, h)

    def _on_push(self, sock, j, h, p):
        # A dropped worker hears so on every push, a late one too (a late
        # push is otherwise answered with the update it missed).
        why = self._dropped_why(j)
        if why:
            return self._send(sock, {"t": "error", "msg": why})
        return super()._on_push(sock, j, h, p)


def _duplicate_of(ranks):
    return "duplicate of rank %s's update" % ", ".join(map(str, ranks))


__all__ = ["Holder", "Sync"]
