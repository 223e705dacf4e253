"""Templates at a service's load: requests sent as a service sends them, through a vLLM
server, open loop (Poisson arrivals at a rate) or closed loop (a concurrency); their
TTFT percentiles and sustainable rate (``measure``, ``report``), and a model that
predicts P95 TTFT at a load from a prompt's features (``profile``, ``model``, ``fit``)."""
