"""Parts of the :class:`~rheo_flow.Rheo` facade (``_rheo.py``) kept in modules of their
own: writing in the application's transaction, and what a trim may remove."""
