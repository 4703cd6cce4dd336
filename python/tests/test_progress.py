"""deepmarket.progress: what a worker writes for its machine to read."""

import json
import os
import tempfile
import types
import unittest
from unittest import mock

from deepmarket import progress


class FakeKeras:
    """Just what keras_callback needs of a Keras module."""
    callbacks = types.SimpleNamespace(Callback=type("Callback", (), {"__init__": lambda self: None}))


class ProgressTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "progress.json")
        progress._last.update(at=0.0, units=-1)
        progress._answers.clear()

    def tearDown(self):
        self.dir.cleanup()

    def read(self):
        with open(self.path) as f:
            return json.load(f)

    def test_report_writes_units_and_loss(self):
        self.assertTrue(progress.report(0, path=self.path))
        self.assertEqual(self.read(), {"units": 0})
        self.assertTrue(progress.report(7, 0.25, path=self.path, force=True))
        self.assertEqual(self.read(), {"units": 7, "loss": 0.25})
        self.assertEqual(os.listdir(self.dir.name), ["progress.json"])  # no temp file left

    def test_at_most_once_a_second_unless_forced(self):
        progress.report(1, path=self.path)
        self.assertFalse(progress.report(2, path=self.path))
        self.assertEqual(self.read()["units"], 1)
        self.assertTrue(progress.report(3, path=self.path, force=True))

    def test_answers_go_with_every_report(self):
        self.assertFalse(progress.answers(0, 1, 1, path=self.path))  # nothing reported yet: kept for the first
        progress.report(3, path=self.path)
        self.assertEqual(self.read(), {"units": 3, "accepted": 0, "refused": 1, "refused_run": 1})
        self.assertTrue(progress.answers(0, 2, 2, path=self.path))  # written at once, with the last units
        self.assertEqual(self.read(), {"units": 3, "accepted": 0, "refused": 2, "refused_run": 2})
        progress.answers(1, 2, 0, path=self.path)
        progress.report(4, 0.5, path=self.path, force=True)
        self.assertEqual(self.read(), {"units": 4, "loss": 0.5, "accepted": 1, "refused": 2, "refused_run": 0})
        with self.assertRaises(ValueError):
            progress.answers(-1, 0, 0, path=self.path)

    def test_reports_from_two_threads_do_not_collide(self):
        # An overlapped averager's thread writes the round answers while the
        # training loop reports its epochs: both renamed one temp file, and a
        # worker died on the rename that found it gone.
        import threading
        progress.report(0, path=self.path)
        errors = []

        def run(f):
            try:
                for i in range(300):
                    f(i)
            except Exception as e:  # noqa: BLE001 - any error fails the test below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(lambda i: progress.report(i, path=self.path, force=True),)),
                   threading.Thread(target=run, args=(lambda i: progress.answers(i, 0, 0, path=self.path),))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(os.listdir(self.dir.name), ["progress.json"])
        self.assertIn("units", self.read())

    def test_without_the_variable_nothing_happens(self):
        with mock.patch.dict(os.environ, {}, clear=True):
            self.assertFalse(progress.report(5))

    def test_bad_values(self):
        with self.assertRaises(ValueError):
            progress.report(-1, path=self.path)
        progress.report(4, float("nan"), path=self.path, force=True)
        self.assertEqual(self.read(), {"units": 4})  # a NaN loss is left out

    def test_keras_callback_counts_batches(self):
        with mock.patch.dict(os.environ, {progress.ENV: self.path}):
            cb = progress.keras_callback(FakeKeras)
            for b in range(3):
                cb.on_train_batch_end(b, {"loss": 1.5 - b})
            cb.on_test_batch_end(0)
            cb.on_test_end()
        self.assertEqual(self.read(), {"units": 4, "loss": -0.5})

    def test_keras_callback_reports_steps_accuracy_and_evaluations(self):
        with mock.patch.dict(os.environ, {progress.ENV: self.path}):
            cb = progress.keras_callback(FakeKeras)
            cb.params = {"epochs": 3, "steps": 10}
            cb.on_train_begin()
            cb.on_epoch_begin(1)  # a fit resumed at its second epoch
            cb.on_train_batch_end(0, {"loss": 0.9, "accuracy": 0.7})
            cb.params = {"epochs": 1, "steps": 5}  # evaluate() inside fit gives its own
            cb.on_test_batch_end(0)
            cb.on_test_end({"loss": 0.8, "accuracy": 0.75})
            cb.on_train_batch_end(1, {"loss": 0.85, "sparse_categorical_accuracy": 0.72})
            cb.on_train_end()
        self.assertEqual(self.read(), {"units": 3, "loss": 0.85, "accuracy": 0.72, "steps": 12, "total": 30,
                                       "eval_loss": 0.8, "eval_accuracy": 0.75, "eval_at": 11})

    def test_across_replicas_the_epochs_figures_only(self):
        with mock.patch.dict(os.environ, {progress.ENV: self.path}):
            cb = progress.keras_callback(FakeKeras)
            cb.model = types.SimpleNamespace(distribute_strategy=types.SimpleNamespace(num_replicas_in_sync=2))
            cb.params = {"epochs": 1, "steps": 2}
            cb.on_train_begin()
            cb.on_train_batch_end(0, {"loss": 1.1, "accuracy": 0.998})  # what tf_keras logs there
            cb.on_epoch_end(0, {"loss": 0.55, "accuracy": 0.81})
        self.assertEqual(self.read(), {"units": 1, "loss": 0.55, "accuracy": 0.81, "steps": 1, "total": 2})

    def test_figures_out_of_bounds_are_left_out(self):
        progress.report(4, 0.5, path=self.path, force=True, accuracy=float("inf"), eval_loss=float("nan"),
                        steps=-2, total=10)
        self.assertEqual(self.read(), {"units": 4, "loss": 0.5, "total": 10})


if __name__ == "__main__":
    unittest.main()
