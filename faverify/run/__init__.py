"""The run: a fuzz, from the plan to every case's result.

Evaluating one case (the subject's call, its outputs checked and judged, its memory budget, its
determinism), the sequential and parallel drivers, the isolated workers, signals, the example store and
the replay that confirms a reproducer. Imports the judge, the reports, the subjects, the cases, the base.
"""
