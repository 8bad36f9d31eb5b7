from django.urls import path

from webapp.registry import views

app_name = "registry"
urlpatterns = [
    path("", views.entry_list, name="list"),
    path("register/", views.register, name="register"),
    path("<int:pk>/", views.entry_detail, name="detail"),
    path("<int:pk>/reinspect/", views.reinspect, name="reinspect"),
    path("<int:pk>/try/", views.try_tool, name="try"),
]
