"""A subject that loads in faverify's own process but not in its worker processes, as the CUDA kernels do
where the parent reuses a library it built and a worker must build it with no working compiler."""
import multiprocessing

from faverify.errors import EnvironmentProblem
from property_tests.planted import correct

if multiprocessing.parent_process() is not None:
    raise EnvironmentProblem("planted: compiling the kernels failed (gcc: No such file or directory)")

__all__ = ["correct"]
