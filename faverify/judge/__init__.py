"""The judge: the FP64 reference and the rule that compares a subject's tensors with it.

The reference attention (dense, per sequence, split partials), the error metrics, the tolerance and its
verdict, and the directional gradient check. Imports the cases, the subjects' interface and the base.
"""
