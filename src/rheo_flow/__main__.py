"""``python -m rheo_flow``: the ``rheo-flow`` command line (:func:`main`, the script's
entry point too)."""

from __future__ import annotations

import gc


def main() -> None:
    """Entry point of the ``rheo-flow`` script and of ``python -m rheo_flow``: the app
    (:func:`rheo_flow._cli._app.main`), loaded with the cyclic collector paused.

    Loading it builds objects that live until the process ends (modules, classes,
    functions): they are frozen (``gc.freeze``) before the collector resumes, instead
    of being walked by the collections that loading them would trigger (about 7 ms).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        from ._cli._app import main as run_app

        gc.freeze()
    finally:
        if enabled:
            gc.enable()
    run_app()


if __name__ == "__main__":
    main()
