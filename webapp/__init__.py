"""The AgentFly web app: a Django project whose Celery workers run training jobs.

Importing the package loads the Celery app so that ``@shared_task`` functions bind to it in every process
(web, worker, tests).
"""

from webapp.celery import app as celery_app

__all__ = ["celery_app"]
