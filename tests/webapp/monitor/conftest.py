"""The live-monitoring tests' fixtures (``tests/webapp/monitor/fixtures.py``, shared with ``tests/e2e/``)."""

from tests.webapp.monitor.fixtures import alice_cookie, alice_job, bob_cookie, private_channel_layer  # noqa: F401
