"""The run: a fuzz, from what it was asked (request.FuzzRun) to every case's result, stage by stage (fuzz.py).

Evaluating one case (the subject's call, its outputs checked and judged, its memory budget, its
determinism), the draw, the sequential and parallel modes, the shrink, the isolated workers, signals, the
example store and the replay that confirms a reproducer. Imports the reports, the subjects, the judge, the
kernels, the cases, the base.
"""
