"""Benchmarks that print figures (JSON to stdout, reports into artifacts/bench/)."""
