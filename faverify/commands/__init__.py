"""The commands: fuzz's request and its checks, golden verify and record, doctor, mutants, bench.

Each composes the run, the judge, the reports and the subjects; the CLI (faverify.cli) parses arguments
and calls one of these.
"""
