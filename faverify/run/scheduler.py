"""One scheduler for every pool of worker processes: the fuzz's case workers (isolation.Worker), golden
verify's and doctor's per-job workers, and `faverify mutants`' job processes (mutants.MutantJob).

Workers are grouped in lanes; each lane has a queue of its own (a fuzz: one lane; doctor: one per subject
and GPU; mutants: one). run() keeps every worker busy with its lane's next item and calls back as each
result comes. A worker is anything with submit(item), collect() -> result or None while it is not
ready, waitables() (what multiprocessing.connection.wait may wait on) and stop().
"""
from __future__ import annotations

import os
from multiprocessing.connection import wait
from typing import Callable, Hashable, Iterable

POLL_SECONDS = 1.0  # a worker's timeout is noticed within this long


def cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class _Fifo:
    """A lane's queue: its items in order, whatever the worker."""

    def __init__(self, items: Iterable):
        self.items = iter(items)

    def take(self, worker):
        return next(self.items, None)


class Affinity:
    """A lane's queue that keeps each key with one worker: a free worker gets the next item whose key it ran
    before, else the next one whose key no worker has run, else the next one (a key then runs on two
    workers rather than a worker idling). Looks LOOKAHEAD items ahead. For a subject that compiles per
    configuration (Subject.compile_key), a configuration then compiles in one worker, not in each."""

    LOOKAHEAD = 64

    def __init__(self, items: Iterable, key: Callable[[object], Hashable], owner: dict | None = None):
        self.items, self.key = iter(items), key
        self.ahead: list = []  # (key, (tag, item)) in order
        self.owner: dict = dict(owner or {})  # key -> the worker that ran it first (owner: a warm-up's)

    def take(self, worker):
        while len(self.ahead) < self.LOOKAHEAD:
            entry = next(self.items, None)
            if entry is None:
                break
            self.ahead.append((self.key(entry[1]), entry))
        if not self.ahead:
            return None
        keys = [k for k, _ in self.ahead]
        pick = next((i for i, k in enumerate(keys) if self.owner.get(k) is worker), None)
        if pick is None:
            pick = next((i for i, k in enumerate(keys) if k not in self.owner), 0)
        key, entry = self.ahead.pop(pick)
        self.owner.setdefault(key, worker)
        return entry


def _queue(items):
    return items if isinstance(items, Affinity) else _Fifo(items)


class Pool:
    """Workers by lane. `lanes`: {lane: [worker, ...]}; a pool of one lane can also be made from a list."""

    def __init__(self, lanes: dict | list):
        self.lanes: dict = {None: list(lanes)} if isinstance(lanes, list) else {k: list(v) for k, v in lanes.items()}

    @property
    def workers(self) -> list:
        return [w for ws in self.lanes.values() for w in ws]

    def run(self, queues: dict, on_result: Callable[[Hashable, object, object], None],
            on_lane_done: Callable[[Hashable], None] = lambda lane: None) -> None:
        """queues: {lane: iterable of (tag, item)}; on_result(lane, tag, result) as each item finishes,
        on_lane_done(lane) once a lane's queue is empty and its workers idle (at once for an empty one).
        Items are pulled from a queue only when a worker of its lane is free, so a queue may be a
        generator that is still being drawn."""
        pending = {lane: _queue(queues.get(lane, ())) for lane in self.lanes}
        exhausted: set = set()
        busy: dict = {}  # worker -> (lane, tag)
        done: set = set()
        while True:
            for lane, workers in self.lanes.items():
                for w in workers:
                    if w in busy or lane in exhausted:
                        continue
                    entry = pending[lane].take(w)
                    if entry is None:
                        exhausted.add(lane)
                        break
                    tag, item = entry
                    w.submit(item)
                    busy[w] = (lane, tag)
            for lane in self.lanes:
                if lane in exhausted and lane not in done and not any(b[0] == lane for b in busy.values()):
                    done.add(lane)
                    on_lane_done(lane)
            if not busy:
                return
            wait([c for w in busy for c in w.waitables()], timeout=POLL_SECONDS)
            for w in list(busy):
                result = w.collect()
                if result is not None:
                    lane, tag = busy.pop(w)
                    on_result(lane, tag, result)

    def map(self, items: Iterable, on_result: Callable[[object, object], None]) -> None:
        """run() over a pool of one lane: items (tag, item), on_result(tag, result)."""
        (lane,) = self.lanes
        self.run({lane: items}, lambda _lane, tag, result: on_result(tag, result))

    def retain(self, per_device: int) -> None:
        """Keep the first `per_device` workers of each device in every lane, stop the others (after a
        warm-up that used more)."""
        for lane, workers in self.lanes.items():
            kept, seen = [], {}
            for w in workers:
                seen[w.device] = seen.get(w.device, 0) + 1
                if seen[w.device] <= per_device:
                    kept.append(w)
                else:
                    w.stop()
            self.lanes[lane] = kept

    def close(self) -> None:
        for w in self.workers:
            w.stop()

    @property
    def restarts(self) -> int:
        return sum(getattr(w, "restarts", 0) for w in self.workers)
