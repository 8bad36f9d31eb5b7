from django.urls import path

from webapp.mcpservers import views

app_name = "mcpservers"
urlpatterns = [
    path("", views.server_list, name="list"),
    path("register/", views.register, name="register"),
    path("<int:pk>/", views.server_detail, name="detail"),
    path("<int:pk>/reinspect/", views.reinspect, name="reinspect"),
    path("<int:pk>/try/", views.try_tool, name="try"),
]
