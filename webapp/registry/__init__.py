"""The tool and reward registry: entries by import path, versioned by source hash, introspected on workers."""
