"""Analyses: pure functions from event tables to result tables. No I/O, no printing."""
