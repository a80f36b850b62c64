"""The runtimes over the facade: consumer groups and the demand-driven producer.

A :class:`~rheo_flow.Group` runs a :class:`~rheo_flow.Consumer` over a
:class:`~rheo_flow.Producer`; beside them live the in-flight bookkeeping, the
fetch backoff, the retry policy, the settle calls through the decision table and
the one schema of every runtime's options.
"""
