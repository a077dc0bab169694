"""The commands beside fuzz: golden verify and record, doctor, mutants, bench.

Each composes the run, the judge, the reports and the subjects; the CLI (faverify.cli) parses arguments
and calls one of these, or the run's fuzz.
"""
