"""The peers benchmark (``python -m bench.bench_peers``): ours against DSPy's MIPROv2 and GEPA.

One module per job; ``bench/bench_peers.py`` is the command line and says what is measured.

* :mod:`~bench.peers.counting`: what every side's search costs at the engine;
* :mod:`~bench.peers.records`: the one split every side gets, and ours' copy of the spec;
* :mod:`~bench.peers.templates`: every side's template scored and timed the same way;
* :mod:`~bench.peers.ours`: ours, through the nightly's pipeline stages;
* :mod:`~bench.peers.dspy_program` and :mod:`~bench.peers.dspy_side`: a peer's program,
  metric and compile;
* :mod:`~bench.peers.compare`: one spec, every side;
* :mod:`~bench.peers.goal`: what ours must reach against each peer;
* :mod:`~bench.peers.report` and :mod:`~bench.peers.merge`: the markdown report, and one
  report from separate runs.
"""

PEERS = ("mipro", "gepa", "gepa_ttft")
"""The peers, in the report's order."""
