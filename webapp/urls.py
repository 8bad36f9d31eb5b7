from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from webapp.accounts.api import InvitationViewSet, obtain_token
from webapp.jobs.api import JobViewSet
from webapp.registry.api import EntryViewSet

router = DefaultRouter()
router.register("registry", EntryViewSet, basename="entry")
router.register("jobs", JobViewSet, basename="job")
router.register("invitations", InvitationViewSet, basename="invitation")

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="jobs:list", permanent=False)),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/", include("webapp.accounts.urls")),
    path("registry/", include("webapp.registry.urls")),
    path("jobs/", include("webapp.jobs.urls")),
    path("monitor/", include("webapp.monitor.urls")),
    path("admin/", admin.site.urls),
    path("api/", include(router.urls)),
    path("api/token/", obtain_token, name="api-token"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]
