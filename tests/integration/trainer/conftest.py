"""The trainer's integration tests run torch on one thread (several test processes share the cores)."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
