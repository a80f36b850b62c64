"""Small helpers any layer may use: clocks, retrying a call that failed, waiting."""
