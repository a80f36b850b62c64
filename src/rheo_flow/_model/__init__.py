"""The model: the values every layer passes around, with no I/O and nothing below it.

Events, leases, streams and groups, queries and their pages, settle results and
their classification, what a handler returns, the typed errors, capability
declarations, routing of keys to partitions, input validation and the records an
append sends. The backends, the facade and the runtimes all build on it.
"""
