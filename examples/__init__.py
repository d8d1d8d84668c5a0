"""Example apps; each is exercised by a test."""
