"""The ``rheo-flow`` command line.

``_app`` builds the app and registers every command; ``_inspect`` and ``_ops``
hold the read-only and the changing commands, ``_common`` what they share; the
subpackages ``top``, ``demo`` and ``worker`` hold the live view, the demo and the
long-lived worker process.
"""
