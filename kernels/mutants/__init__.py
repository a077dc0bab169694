"""Seeded bugs in the bundled Triton kernels: what `faverify mutants` must catch.

Each mutant is one text replacement in one source file of kernels/triton/, the way kernel authors
really get it wrong, with the reason they do. catalog.py lists them; build.py applies one and imports
the result as its own package (so Triton compiles it under its own source hash).
"""
