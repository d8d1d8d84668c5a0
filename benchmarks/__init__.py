"""Benchmark helpers: a fast, deterministic seeder for query-plan and load measurements."""
