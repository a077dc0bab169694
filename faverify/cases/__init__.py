"""Cases: what one fuzz case is and how its tensors are drawn.

The Case record and its vocabulary, the Hypothesis strategies that draw cases, the inputs a case's seed
makes (values, layouts, masks, score modifications, ragged batches, margins), the conventions a subject
declares, and the golden file format. Imports only faverify's base modules (errors, dtypes, devices, env).
"""
