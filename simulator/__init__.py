"""A trace-driven discrete-event simulator that drives the production scheduling core.

``simulator.engine`` runs one policy over a workload on a fleet; ``simulator.policies``
holds the baselines; ``simulator.metrics`` and ``simulator.report`` turn runs into tables
and plots; ``simulator.estimate`` is the queue-wait estimator (SPEC R7.2). Importing this
package imports nothing heavy (no matplotlib, no numpy).
"""
