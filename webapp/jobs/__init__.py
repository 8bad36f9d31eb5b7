"""Training jobs: the launch form and API, the state machine, and the Celery task that runs the trainer."""
