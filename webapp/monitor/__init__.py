"""Monitoring: the events a job emits, stored with per-job sequence numbers and announced to its group."""
