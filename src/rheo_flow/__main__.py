"""``python -m rheo_flow``: the ``rheo-flow`` command line."""

from ._cli._app import main

main()
