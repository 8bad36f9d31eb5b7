"""Browser tests: Debian's Chromium driven by Playwright against Daphne and the real worker.

The web app's fixtures come from ``tests/webapp/fixtures.py`` (loaded for every test package); the monitoring
fixtures (a private channel layer per test, alice's job, session cookies) from ``tests/webapp/monitor/``.
"""

from tests.webapp.monitor.fixtures import alice_cookie, alice_job, bob_cookie, private_channel_layer  # noqa: F401
