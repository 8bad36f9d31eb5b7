"""The settings that mypy's Django plugin loads (``[tool.django-stubs]`` in pyproject.toml): the real ones,
with a placeholder ``SECRET_KEY`` when none is set, so that ``mypy webapp`` needs no environment. The plugin
imports settings to build the app registry; nothing here is served.
"""

import os

os.environ.setdefault("SECRET_KEY", "type-checking-only")

from webapp.settings import *  # noqa: F403
