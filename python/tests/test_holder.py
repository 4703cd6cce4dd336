"""The model's holder between real sockets on loopback: workers as threads.

No TensorFlow: the model is a linear regression trained by plain gradient
steps, so a run takes a second. Honest workers, and hostile ones (scaled,
random, NaN, empty and echoed updates, a worker that never pushes), train
together; the holder's checks must keep the model as good as the honest
workers alone make it, and account the hostile ones no accepted round.
Each hostile case is also run with the checks off, and must then do harm:
the test of a check that cannot fail would prove nothing. Greedy lenders
too: a pair where one hands in the other's update (collusion: each pushes
to the holder alone), and a worker that echoes the last global update
turned just under the echo bound; with their check off, they are paid.
Spot checks replay a worker's round from the state it committed (the
batches it trains on follow from its rank and data cursor): a worker that
takes fewer steps than it says, forges its state or leaves a check
unanswered forfeits its pay; with spot checks off, the shirker is paid.
test_keras_holder.py runs the same between real Keras processes.
"""

import json
import os
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import numpy as np

from deepmarket.train import Averager, Peers
from deepmarket.train.averager import Dropped, HolderGone
from deepmarket.train.holder import Holder, validation_batch
from test_averager import free_addrs

D = 40          # features
H = 5           # inner steps a round
LR = 0.05       # inner learning rate


def problem(seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(D).astype(np.float32)
    x = rng.standard_normal((4000, D)).astype(np.float32)
    y = x @ w + 0.1 * rng.standard_normal(4000).astype(np.float32)
    return x[:3000], y[:3000], x[3000:], y[3000:]


X, Y, XV, YV = problem()


def mse(theta, x=XV, y=YV):
    r = x @ theta - y
    return float(np.mean(r * r))


STATE = b"plain SGD has no optimizer state"


def sgd(theta, rank, cursor, steps):
    """steps of SGD from theta on rank's shard, the batches following from
    its data cursor: what a worker does, and what the holder replays."""
    x, y = X[rank * 600:(rank + 1) * 600], Y[rank * 600:(rank + 1) * 600]
    w = np.array(theta, dtype=np.float32)
    for s in range(steps):
        i = np.random.default_rng([rank, cursor + s]).integers(0, len(x), 64)
        g = 2 * x[i].T @ (x[i] @ w - y[i]) / 64
        w -= LR * g.astype(np.float32)
    return w


def replay(theta, state, rank, cursor, steps):
    if state != STATE:
        raise ValueError("not an SGD state")
    return sgd(theta, rank, cursor, steps)


class Board:
    """What colluding workers share: a source's weights, by round."""

    def __init__(self):
        self.cv = threading.Condition()
        self.posts = {}

    def post(self, r, local):
        with self.cv:
            self.posts[r] = local.copy()
            self.cv.notify_all()

    def take(self, r):
        with self.cv:
            if not self.cv.wait_for(lambda: r in self.posts, timeout=10):
                raise TimeoutError("no source posted round %d" % r)
            return self.posts[r]


# Seconds a worker holds its update back once it has it (after training).
HOLD = {"copycat": 0.3, "late_source": 0.3}


def turned(last, cos, rng):
    """last turned to cosine `cos` with it, noise for the rest: the same norm."""
    ln = np.linalg.norm(last)
    noise = rng.standard_normal(D).astype(np.float32)
    noise -= (noise @ last) / (ln * ln) * last
    noise *= ln / np.linalg.norm(noise)
    return (cos * last + np.sqrt(1 - cos * cos) * noise).astype(np.float32)


class Member:
    """A worker thread: `behaviour` says what it hands in."""

    def __init__(self, rank, addrs, holder, rounds, behaviour="honest", timeout=5.0, verify=False, board=None):
        self.rank, self.rounds, self.behaviour, self.verify = rank, rounds, behaviour, verify
        self.board, self.round = board, 0
        self.cursor = 0
        self.log = []
        self.av = Averager(Peers(rank, addrs, "test", holder=holder), sync_every=H, compress="none",
                           outer_lr=1.0, outer_momentum=0.0, timeout=timeout, join_timeout=10, connect_timeout=2, log=self.log.append)
        shard = slice(rank * 600, (rank + 1) * 600)
        self.x, self.y = X[shard], Y[shard]
        self.rng = np.random.default_rng(100 + rank)
        self.error = None
        self.prev = None
        self.done = threading.Event()  # set once the holder is done (a silent worker waits for it)
        self.thread = threading.Thread(target=self._run, daemon=True)
        if behaviour == "nan":  # a hostile worker sends what the codec would not encode
            self.av._push = self._raw_push
        if behaviour == "mute":  # never answers a spot check
            self.av._answer_check = lambda c, h: None
        if behaviour == "forge":  # answers a spot check with another state than it committed
            self.av._answer_check = self._forged_proof

    def _forged_proof(self, c, h):
        if isinstance(h.get("check"), int):
            try:
                self.av._request(c, {"t": "proof", "for_round": h["check"], "cursor": 0}, b"another state", reuse=True)
            except Exception as e:
                self.log.append("forged proof: %s" % e)

    def _raw_push(self, c, delta, steps, stop):
        payload = np.ascontiguousarray(delta, dtype="<f4").tobytes()
        return self.av._request(c, {"t": "push", "steps": steps, "stop": False, "codec": "none", "n": D},
                                payload, reuse=True)

    def start(self):
        self.thread.start()
        return self

    def _train(self, theta):
        # A shirker takes 2 of the round's 5 steps and says it took 5.
        w = sgd(theta, self.rank, self.cursor, 2 if self.behaviour == "shirk" else H)
        self.cursor += H
        return w

    def _local(self, theta):
        honest = self._train(theta)
        b = self.behaviour
        if b in ("honest", "slow", "late", "shirk", "mute", "forge", "uncommitted"):
            return honest
        if b == "faint":  # noise far smaller than any round's work
            return theta + 1e-4 * self.rng.standard_normal(D).astype(np.float32)
        if b == "scaled":
            return theta - 1000 * (theta - honest)
        if b == "random":
            return theta + self.rng.standard_normal(D).astype(np.float32)
        if b == "nan":
            out = honest.copy()
            out[3] = np.nan
            return out
        if b == "empty":
            return theta.copy()
        if b == "echo":  # hands back the last global update, having trained nothing
            return theta - (self.prev - theta) if self.prev is not None else theta.copy()
        if b in ("rotated", "rotated_faint"):  # the same, turned to a cosine of 0.97 (a faint one: scaled down)
            if self.prev is None:
                return theta.copy()
            return theta - (0.3 if b == "rotated_faint" else 1.0) * turned(self.prev - theta, 0.97, self.rng)
        if b in ("source", "late_source"):  # trains, and gives its update away
            self.board.post(self.round, honest)
            return honest
        if b == "copycat":  # hands in the source's update (nearly: 1% noise), having trained nothing
            delta = theta - self.board.take(self.round)
            noise = self.rng.standard_normal(D).astype(np.float32)
            return theta - (delta + 0.01 * np.linalg.norm(delta) / np.linalg.norm(noise) * noise)
        raise ValueError(b)

    def _run(self):
        try:
            res = self.av.start(np.zeros(D, np.float32))
            while not res.stop and res.round < self.rounds:
                if self.behaviour == "silent":  # joined, then never hands anything in
                    self.done.wait(60)
                    break
                time.sleep({"slow": 0.5, "late": 1.0}.get(self.behaviour, 0.01))
                if self.verify and self.behaviour != "uncommitted":
                    self.av.commit_start(STATE, self.cursor)
                self.round = res.round
                local = self._local(res.theta)
                time.sleep(HOLD.get(self.behaviour, 0))
                before = res.theta
                res = self.av.sync(local, H)
                self.prev = before
            self.av.close()
        except Exception as e:  # reported by the test
            self.error = e
            self.av.close()


def run(behaviours, rounds=20, checks=True, drop_after=100, timeout=5.0, verify_rate=0.0, verify_share=0.2, **kw):
    """Runs a holder and one worker per behaviour; returns (holder, members,
    final theta). kw: more of Holder's arguments (check: mse unless given)."""
    n = len(behaviours)
    addrs = free_addrs(n + 1)
    hp = Peers(n, addrs, "test", holder=n)
    kw.setdefault("check", mse)
    holder = Holder(hp, H, checks=checks, compress="none", timeout=timeout, join_timeout=10,
                    connect_timeout=2, drop_after=drop_after, outer_lr=1.0, outer_momentum=0.0, log=lambda m: None,
                    verify_rate=verify_rate, verify_share=verify_share, replay=replay if verify_rate else None, **kw)
    holder.start(np.zeros(D, np.float32))
    board = Board()
    members = [Member(r, addrs, n, rounds, b, timeout=timeout, verify=verify_rate > 0, board=board).start()
               for r, b in enumerate(behaviours)]
    while True:
        res = holder.next_round()
        if res is None or res.round >= rounds:
            break
    theta = holder.theta.copy()
    for m in members:
        m.done.set()
    holder.close(finished=True)
    for m in members:
        m.thread.join(30)
    return holder, members, theta


class HolderTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        _, _, cls.honest = run(["honest", "honest"])
        cls.honest_loss = mse(cls.honest)

    def test_honest_workers_train_and_are_accounted(self):
        holder, members, theta = run(["honest", "honest", "honest"])
        self.assertLess(mse(theta), 0.05)  # the noise is 0.01
        acc = holder.accounts()
        for r in range(3):
            self.assertGreaterEqual(acc[str(r)]["accepted"], 19, acc)
            self.assertEqual(acc[str(r)]["refused"], 0, acc)
            self.assertGreater(acc[str(r)]["seconds"], 0)
        for m in members:
            self.assertIsNone(m.error)

    def test_hostile_updates_are_refused(self):
        for bad in ["scaled", "random", "nan", "empty", "echo", "faint"]:
            with self.subTest(bad):
                holder, members, theta = run(["honest", "honest", bad])
                acc = holder.accounts()
                # (a faint update's first round has no median to be under)
                self.assertLessEqual(acc["2"]["accepted"], 1 if bad == "faint" else 0, acc)
                self.assertGreater(acc["2"]["refused"], 15, acc)
                self.assertGreaterEqual(acc["0"]["accepted"], 19, acc)
                self.assertLess(mse(theta), 1.5 * self.honest_loss + 0.01, "%s: %.4f vs %.4f honest"
                                % (bad, mse(theta), self.honest_loss))

    def test_without_the_checks_they_do_harm(self):
        for bad in ["scaled", "random", "nan", "empty", "echo", "faint"]:
            with self.subTest(bad):
                if bad == "nan":  # the average cannot even be sent: the holder fails
                    with self.assertRaisesRegex(ValueError, "NaN"):
                        run(["honest", "honest", bad], checks=False)
                    continue
                holder, _, theta = run(["honest", "honest", bad], checks=False)
                acc = holder.accounts()
                self.assertGreater(acc["2"]["accepted"], 0, acc)  # paid for what it did
                if bad in ("scaled", "random", "nan"):
                    loss = mse(theta)
                    self.assertTrue(not np.isfinite(loss) or loss > 2 * self.honest_loss, "%s: %.4f" % (bad, loss))

    def test_a_copycat_and_its_source_are_both_refused(self):
        # The copy arrives once the source's update was accepted (which
        # must then be taken out of the round), or before the source's.
        for source in ("source", "late_source"):
            with self.subTest(source):
                holder, members, theta = run(["honest", source, "copycat"], rounds=8)
                acc = holder.accounts()
                self.assertEqual(acc["0"], dict(acc["0"], accepted=8, refused=0), acc)
                for r, other in (("1", "2"), ("2", "1")):
                    self.assertEqual(acc[r], dict(acc[r], accepted=0, refused=8, seconds=0), acc)
                    self.assertIn("duplicate of rank %s's update" % other, acc[r]["last_refusal"])
                self.assertLess(mse(theta), 0.05)
                for m in members:
                    self.assertIsNone(m.error)
        # With the check off (a bound over any cosine), both are paid.
        holder, _, _ = run(["honest", "source", "copycat"], rounds=8, duplicate=2.0)
        acc = holder.accounts()
        self.assertEqual((acc["1"]["accepted"], acc["2"]["accepted"]), (8, 8), acc)
        self.assertGreater(acc["2"]["seconds"], 0, acc)

    def test_a_refusal_names_the_evidence_its_worker_keeps(self):
        # What the holder's accounts name of a refusal (the payer's node
        # signs it into its answer) is what the refused worker keeps for an
        # appeal, digest for digest: the round's theta, theta before the
        # last update (the echo check's) and the update as decoded.
        from deepmarket.train import evidence
        with tempfile.TemporaryDirectory() as d:
            orig = Member.__init__

            def init(m, rank, *a, **kw):
                orig(m, rank, *a, **kw)
                m.av.evidence_dir = os.path.join(d, str(rank))
            Member.__init__ = init
            try:
                holder, members, _ = run(["honest", "random"], rounds=6)
            finally:
                Member.__init__ = orig
            ref = holder.accounts()["1"]["refusal"]
            self.assertEqual(ref["round"], 5, ref)
            self.assertFalse(os.path.exists(os.path.join(d, "0")))  # never refused: nothing kept
            kept = sorted(os.listdir(os.path.join(d, "1")))
            self.assertEqual(kept, ["round-3", "round-4", "round-5"])  # the newest KEEP rounds
            meta, theta, prev, update, model = evidence.load(os.path.join(d, "1", "round-5"))
            self.assertEqual((meta["theta"], meta["prev"], meta["update"]), (ref["theta"], ref["prev"], ref["update"]))
            self.assertEqual(evidence.digest(theta), ref["theta"])
            self.assertEqual(evidence.digest(prev), ref["prev"])
            self.assertEqual(evidence.digest(update), ref["update"])
            self.assertIsNone(model)
            self.assertTrue(ref["prev"])

    def test_a_duplicate_vetted_before_its_twin_is_stored_refuses_both(self):
        # Rank 0's push is vetted and accepted, and not yet in the round
        # (Averager._on_push stores it just after) when rank 1's copy of it
        # is vetted: rank 0's delta must still leave the round's average.
        addrs = free_addrs(3)
        holder = Holder(Peers(2, addrs, "test", holder=2), H, check=mse, compress="none", timeout=2,
                        join_timeout=1, connect_timeout=1, log=lambda m: None)
        holder.start(np.zeros(D, np.float32))
        try:
            theta, h = holder.theta, {"steps": H, "digest": holder._state.digest}
            delta = theta - sgd(theta, 0, 0, H)
            accepted, why = holder._vet(0, 0, delta, h)
            self.assertIs(accepted, delta, why)
            got = []
            copy = threading.Thread(target=lambda: got.append(holder._vet(1, 0, delta.copy(), h)))
            copy.start()
            time.sleep(0.2)
            with holder._cv:  # rank 0's push is stored in the round
                holder._pending[0] = (delta, H, False)
                holder._cv.notify_all()
            copy.join(5)
            self.assertEqual(len(got), 1)
            self.assertEqual(got[0][1], "duplicate of rank 0's update")
            self.assertIsNone(got[0][0])
            self.assertIsNone(holder._pending[0][0])  # refused: out of the round's average
            self.assertIn("duplicate of rank 1's update", holder.accounts()["0"]["last_refusal"])
        finally:
            holder.close()

    def test_an_echo_turned_under_the_bound_is_refused(self):
        # The last global update turned to a cosine of 0.97 (under echo's
        # 0.98), noise of its size for the rest: its echo helps the loss,
        # and only the rest of it, no work, gives it away. Without a loss
        # check, a faint rest does.
        for bad, check in [("rotated", mse), ("rotated_faint", None)]:
            with self.subTest(bad):
                holder, _, theta = run(["honest", "honest", bad], check=check)
                acc = holder.accounts()
                self.assertLessEqual(acc["2"]["accepted"], 3, acc)
                self.assertIn("leans on the last global update", acc["2"]["last_refusal"])
                for r in ("0", "1"):
                    self.assertEqual(acc[r], dict(acc[r], accepted=20, refused=0), acc)
                self.assertLess(mse(theta), 1.5 * self.honest_loss + 0.01)
                # With the check off (a bound over any cosine), it is paid.
                holder, _, _ = run(["honest", "honest", bad], check=check, residual=2.0)
                acc = holder.accounts()
                self.assertGreater(acc["2"]["accepted"], 15, acc)

    def test_a_slow_honest_worker_is_paid_for_its_rounds(self):
        holder, _, theta = run(["honest", "slow"], rounds=10)
        acc = holder.accounts()
        self.assertEqual(acc["1"]["accepted"], 10, acc)
        self.assertEqual(acc["1"]["refused"], 0, acc)
        # Every round it contributed is paid; its longer rounds count for
        # more time than the fast worker's, up to twice theirs (pay_cap).
        self.assertGreater(acc["1"]["seconds"], 1.5 * acc["0"]["seconds"], acc)
        self.assertLessEqual(acc["1"]["seconds"], 2 * acc["0"]["seconds"] + 0.01, acc)
        self.assertLess(mse(theta), 0.05)

    def test_a_worker_holding_its_update_back_is_not_paid_for_the_wait(self):
        holder, _, _ = run(["honest", "honest", "late"], rounds=6)
        acc = holder.accounts()
        self.assertEqual(acc["2"]["accepted"], 6, acc)
        # It waited 1 s a round; the others took about 0.01 s (tenths
        # beside make test's other suites): paid less than its wait.
        self.assertLess(acc["2"]["seconds"], 1.0 * 6, acc)
        # Each round at most twice its low median (here the slower honest
        # worker's time that round), so at most twice both honest ones' sum.
        self.assertLessEqual(acc["2"]["seconds"], 2 * (acc["0"]["seconds"] + acc["1"]["seconds"]) + 0.01, acc)

    def test_a_silent_worker_earns_nothing_and_stalls_no_round(self):
        t = time.monotonic()
        holder, _, theta = run(["honest", "silent"], rounds=10, timeout=2.0)
        acc = holder.accounts()
        self.assertNotIn("1", acc)
        self.assertEqual(acc["0"]["accepted"], 10)
        self.assertLess(time.monotonic() - t, 20)  # one round waits for it (2 s), the next ones do not

    def test_refused_rounds_in_a_row_drop_the_worker(self):
        holder, members, _ = run(["honest", "scaled"], rounds=12, drop_after=3)
        acc = holder.accounts()
        self.assertTrue(acc["1"]["dropped"], acc)
        self.assertEqual(acc["1"]["refused"], 3)
        self.assertIsInstance(members[1].error, Dropped)
        self.assertIsNone(members[0].error)

    def test_a_worker_fails_when_the_holder_is_gone(self):
        addrs = free_addrs(2)
        m = Member(0, addrs, 1, rounds=5, timeout=1.0)
        m.av.join_timeout = 1.0
        m.start().thread.join(10)
        self.assertIsInstance(m.error, HolderGone)

    def test_a_rank_port_speaks_for_its_rank_only(self):
        # On the network each worker reaches the holder on a port of its
        # own, exposed to its machine alone: a worker that claims another
        # rank there is refused, and the rank it claimed loses nothing.
        addrs = free_addrs(3)
        ranks = free_addrs(2)
        holder = Holder(Peers(2, addrs, "test", holder=2, rank_addrs=ranks), H, check=mse, compress="none",
                        timeout=3, join_timeout=5, connect_timeout=2, outer_lr=1.0, outer_momentum=0.0,
                        log=lambda m: None)
        holder.start(np.zeros(D, np.float32))
        honest = Member(0, addrs[:2] + (ranks[0],), 2, rounds=5)
        impostor = Member(0, addrs[:2] + (ranks[1],), 2, rounds=5, behaviour="scaled")  # on rank 1's port
        impostor.av.join_timeout = 2.0
        honest.start()
        impostor.start()
        while True:
            res = holder.next_round()
            if res is None or res.round >= 5:
                break
        for m in (honest, impostor):
            m.done.set()
        holder.close(finished=True)
        for m in (honest, impostor):
            m.thread.join(30)
        acc = holder.accounts()
        self.assertEqual(acc["0"], dict(acc["0"], accepted=5, refused=0), acc)
        self.assertNotIn("1", acc)
        self.assertIsNone(honest.error)
        self.assertIsInstance(impostor.error, HolderGone)
        self.assertIn("not a peer", str(impostor.error))

    def test_spot_checks_catch_a_shirker_and_pay_the_honest(self):
        holder, members, theta = run(["honest", "honest", "shirk"], rounds=12, verify_rate=0.5)
        acc = holder.accounts()
        for r in ("0", "1"):
            self.assertGreater(acc[r]["checks_passed"], 0, acc)
            self.assertFalse(acc[r]["forfeited"], acc)
            self.assertEqual(acc[r]["held_seconds"], 0, acc)  # passed: nothing held back
            self.assertGreater(acc[r]["seconds"], 0, acc)
            self.assertEqual(len(acc[r]["chain"]), 64, acc)
        bad = acc["2"]
        self.assertTrue(bad["forfeited"] and bad["dropped"], acc)
        self.assertEqual(bad["seconds"], 0, acc)
        self.assertIn("does not replay", bad["check_failure"])
        # Dropped, or the job ended first (caught at its last rounds).
        self.assertIsInstance(members[2].error, (Dropped, HolderGone))
        self.assertLess(mse(theta), 0.05)
        # Spot checks off: its rounds help the loss a little, and it is paid.
        holder, _, _ = run(["honest", "honest", "shirk"], rounds=12)
        acc = holder.accounts()
        self.assertGreater(acc["2"]["accepted"], 5, acc)
        self.assertGreater(acc["2"]["seconds"], 0, acc)

    def test_a_forged_or_unanswered_check_forfeits(self):
        for bad, why in [("forge", "not the one it committed"), ("mute", "did not answer")]:
            with self.subTest(bad):
                holder, members, _ = run(["honest", bad], rounds=12, verify_rate=1.0)
                acc = holder.accounts()
                self.assertTrue(acc["1"]["forfeited"], acc)
                self.assertEqual(acc["1"]["seconds"], 0, acc)
                self.assertIn(why, acc["1"]["check_failure"])
                self.assertFalse(acc["0"]["forfeited"], acc)
                self.assertGreaterEqual(acc["0"]["checks_passed"], 1, acc)

    def test_the_share_is_held_back_until_a_check_passes(self):
        # Never checked (a rate too small to draw in 4 rounds, in practice):
        # the share stays out of its pay.
        holder, _, _ = run(["honest", "honest"], rounds=4, verify_rate=1e-12, verify_share=0.25)
        acc = holder.accounts()
        for a in acc.values():
            self.assertEqual(a["checks_passed"], 0, acc)
            self.assertAlmostEqual(a["held_seconds"], 0.25 * (a["seconds"] + a["held_seconds"]), places=2)
        # A worker that commits to nothing while checks are on is refused.
        holder, _, _ = run(["honest", "uncommitted"], rounds=4, verify_rate=1e-12)
        acc = holder.accounts()
        self.assertEqual(acc["1"]["accepted"], 0, acc)
        self.assertIn("no commitment", acc["1"]["last_refusal"])
        self.assertEqual(acc["0"]["accepted"], 4, acc)

    def test_the_holder_refuses_to_be_a_worker(self):
        addrs = free_addrs(2)
        with self.assertRaises(ValueError):
            Holder(Peers(0, addrs, "test", holder=1), H)

    def test_the_bids_thresholds_rule(self):
        # What the signed bid names (DM_CHECK_*) is what the holder judges
        # by, over what the program gives; then what it gives; then the
        # defaults. Its accounts say which, and the batch's address.
        addrs = free_addrs(2)
        bid = {"DM_CHECK_ECHO": "0.95", "DM_CHECK_TOLERANCE": "0.2", "DM_VALIDATION_CID": "bafkreiexample"}
        h = Holder(Peers(1, addrs, "test", holder=1), H, echo=0.5, duplicate=0.99, environ=bid, log=lambda m: None)
        self.assertEqual((h.echo, h.tolerance, h.duplicate, h.residual, h.norm_factor), (0.95, 0.2, 0.99, 0.9, 10.0))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "holder.json")
            h.write_accounts(path)
            with open(path) as f:
                doc = json.load(f)
        self.assertEqual(doc["checks"]["echo"], 0.95)
        self.assertEqual(doc["validation"], "bafkreiexample")
        plain = Holder(Peers(1, addrs, "test", holder=1), H, environ={}, log=lambda m: None)
        self.assertEqual((plain.echo, plain.tolerance), (0.98, 0.1))
        with self.assertRaises(ValueError):
            Holder(Peers(1, addrs, "test", holder=1), H, environ={"DM_CHECK_ECHO": "high"}, log=lambda m: None)

    def test_the_validation_batch_is_the_bids(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "batch.npz")
            np.savez(path, x=np.ones((4, 2), np.float32), y=np.arange(4))
            got = validation_batch({"DM_VALIDATION": path, "DM_VALIDATION_CID": "bafkreiexample"})
            np.testing.assert_array_equal(got["y"], np.arange(4))
        self.assertIsNone(validation_batch({}))
        with self.assertRaisesRegex(ValueError, "no DM_VALIDATION"):
            validation_batch({"DM_VALIDATION_CID": "bafkreiexample"})


if __name__ == "__main__":
    unittest.main()
