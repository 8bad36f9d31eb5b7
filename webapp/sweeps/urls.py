from django.urls import path

from webapp.sweeps import views

app_name = "sweeps"
urlpatterns = [
    path("", views.sweep_list, name="list"),
    path("new/", views.launch, name="launch"),
    path("<int:pk>/", views.sweep_detail, name="detail"),
    path("<int:pk>/data.json", views.sweep_data, name="data"),
]
