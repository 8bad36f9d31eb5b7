from django.urls import path

from webapp.alerts import views

app_name = "alerts"
urlpatterns = [
    path("", views.alerts, name="list"),
    path("<int:pk>/remove/", views.remove, name="remove"),
]
