"""Alerts: a team asks to be told when a job fails, stalls (no step for a set time) or finishes, by a webhook
(and email where the server has a mail host). A scan on the ``alerts`` queue notices each event once; each
delivery is its own task, retried with backoff, so a slow or dead receiver never holds up a job."""
