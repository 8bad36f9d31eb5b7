from django.urls import path

from webapp.accounts import views

app_name = "accounts"
urlpatterns = [
    path("signup/", views.signup, name="signup"),
    path("signup/<str:token>/", views.signup, name="signup_invited"),
    path("token/", views.api_token, name="token"),
    path("invitations/", views.my_invitations, name="invitations"),
    path("invitations/<int:pk>/accept/", views.answer_invitation, {"answer": "accept"}, name="accept_invitation"),
    path("invitations/<int:pk>/decline/", views.answer_invitation, {"answer": "decline"}, name="decline_invitation"),
    path("teams/", views.team_list, name="teams"),
    path("teams/<slug:slug>/", views.team_detail, name="team"),
    path("teams/<slug:slug>/members/", views.team_add_member, name="add_member"),
    path("teams/<slug:slug>/members/<str:username>/remove/", views.team_remove_member, name="remove_member"),
    path("teams/<slug:slug>/members/<str:username>/admin/", views.team_make_admin, name="make_admin"),
    path("teams/<slug:slug>/invitations/", views.invitation_create, name="invite"),
    path("teams/<slug:slug>/invitations/<int:pk>/revoke/", views.invitation_revoke, name="revoke_invitation"),
]
