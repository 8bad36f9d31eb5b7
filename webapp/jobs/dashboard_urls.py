"""The dashboard's URLs, under ``/monitor/`` and named ``monitor:...`` as they always were; the views are the
jobs app's (``webapp.jobs.dashboard``), which reads the events ``webapp.monitor`` stores."""

from django.urls import path

from webapp.jobs import dashboard as views
from webapp.jobs import groups

app_name = "monitor"
urlpatterns = [
    path("jobs/<int:pk>/", views.dashboard, name="dashboard"),
    path("jobs/<int:pk>/events.json", views.events_json, name="events"),
    path("jobs/<int:pk>/series.json", views.series_json, name="series"),
    path("jobs/<int:pk>/events/<int:seq>.json", views.event_json, name="event"),
    path("jobs/<int:pk>/samples/search.json", views.samples_search, name="samples_search"),
    path("jobs/<int:pk>/notes/", views.job_note, name="job_note"),
    path("compare/", views.compare, name="compare"),
    path("compare/seed-bands.json", groups.seed_bands_json, name="seed_bands"),
]
