"""Prometheus metrics of a store and a worker: ``/metrics``, ``/metrics/lag`` and the
``rheo-flow metrics`` exporter."""
