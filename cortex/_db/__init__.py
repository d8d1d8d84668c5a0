"""Connections: the engine, the pool, transactions, the statement executor, routines and snapshots."""
