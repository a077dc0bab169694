"""The judge: the FP64 reference and the rule that compares a subject's tensors with it.

The reference attention (dense, per sequence, split partials), the error metrics, the tolerance and its
verdict, and the directional gradient check. Imports the cases and the base, never a subject: what calls
one (the gradient check's calls) is the run's, and the controls are subjects.
"""
