"""Subjects: the kernels under test. `resolve(name)` turns a --kernel entry into a Subject."""
from faverify.subjects.base import Capabilities, Subject
from faverify.subjects.registry import builtin_names, resolve, resolve_many

__all__ = ["Capabilities", "Subject", "builtin_names", "resolve", "resolve_many"]
