from django.urls import path

from webapp.jobs import files, views

app_name = "jobs"
urlpatterns = [
    path("", views.job_list, name="list"),
    path("launch/", views.launch, name="launch"),
    path("<int:pk>/", views.job_detail, name="detail"),
    path("<int:pk>/cancel/", views.cancel, name="cancel"),
    path("<int:pk>/resume/", views.resume, name="resume"),
    path("<int:pk>/output/", files.output, name="output"),
    path("<int:pk>/output.log", files.output_download, name="output_download"),
    path("<int:pk>/checkpoints/<int:step>.tar", files.checkpoint_archive, name="checkpoint_archive"),
    path("<int:pk>/checkpoints/<int:step>/export/", files.checkpoint_export, name="checkpoint_export"),
]
