"""A plugin that fails at import time, as a module with a missing dependency would."""

import a_package_that_is_not_installed  # noqa: F401
