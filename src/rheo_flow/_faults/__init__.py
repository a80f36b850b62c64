"""The fault-injection suite behind :mod:`rheo_flow.testing.faults` and ``rheo-flow torture``.

It lives outside :mod:`rheo_flow.testing` so that the command runs on an install
without the ``test`` extra (the conformance kit needs pytest and Hypothesis).
"""
