"""The shipped backends, one module or package each, over the lease rules they share.

``_transitions`` (what a settle, renew or expiry does to one delivery; where a
frontier moves) and ``_shared`` (fair order, fencing, query windows, waiters)
hold the rules once; ``_guard`` wraps every operation so it raises typed errors
within one time limit. The public face is :mod:`rheo_flow.backends`.
"""
