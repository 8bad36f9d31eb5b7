"""Sweeps: one group of jobs launched together over chosen launch fields (a grid, or random draws), within the
team's quota, and the group's page (parallel coordinates, the best run by a chosen metric, each run's curve)."""
