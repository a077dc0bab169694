"""Reports: what a run found, kept and shown.

A case's result, the collector that groups failures, the run file (its schema, writer and reader), the
tables and charts, and comparing or merging runs and doctor reports. Reads JSON and prints: imports the
cases and the base, never the judge or the run, so rendering a run file stays light.
"""
