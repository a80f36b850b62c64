"""``rheo-flow top``: the live view and the command that starts it."""
