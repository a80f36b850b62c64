"""``rheo-flow worker``: the worker process, its supervisor and its health reporting."""
