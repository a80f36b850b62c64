"""``rheo-flow demo``: the scenario, its state, its view and the run."""
