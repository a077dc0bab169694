"""A subject that returns at once in a worker whose judging takes 3 s: faverify's time, which --timeout must
not count as the subject's. The judging is slowed by a sleep, not by a large case, so the subject's own
window holds milliseconds of work and no load on the machine can push it past a timeout of seconds."""
import multiprocessing
import time

from faverify.run import evaluate
from property_tests.planted_trust import zeros

JUDGING_SECONDS = 3.0

if multiprocessing.parent_process() is not None:  # in a worker process alone: the test's own process judges as ever
    _judge = evaluate.judge

    def _slow_judge(*args, **kwargs):
        time.sleep(JUDGING_SECONDS)
        return _judge(*args, **kwargs)

    evaluate.judge = _slow_judge

__all__ = ["zeros"]
