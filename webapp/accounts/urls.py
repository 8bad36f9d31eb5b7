from django.urls import path

from webapp.accounts import views

app_name = "accounts"
urlpatterns = [
    path("signup/", views.signup, name="signup"),
    path("token/", views.api_token, name="token"),
    path("teams/", views.team_list, name="teams"),
    path("teams/<slug:slug>/", views.team_detail, name="team"),
    path("teams/<slug:slug>/members/", views.team_add_member, name="add_member"),
]
