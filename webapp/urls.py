from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, JsonResponse
from django.urls import include, path, re_path
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from webapp import pages
from webapp.accounts.api import InvitationViewSet, MembershipInvitationViewSet, obtain_token
from webapp.jobs import files as job_files
from webapp.jobs.rest import APIQuotaViewSet, JobViewSet
from webapp.mcpservers.api import MCPServerViewSet
from webapp.registry.api import EntryViewSet
from webapp.sweeps.api import SweepViewSet


@csrf_exempt  # nothing happens here; a token client's POST to a wrong path gets the 404, not a CSRF page
def api_not_found(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"detail": "Not found."}, status=404)


router = DefaultRouter()
router.register("registry", EntryViewSet, basename="entry")
router.register("jobs", JobViewSet, basename="job")
router.register("api-quotas", APIQuotaViewSet, basename="api-quota")
router.register("mcp-servers", MCPServerViewSet, basename="mcp-server")
router.register("sweeps", SweepViewSet, basename="sweep")
router.register("invitations", InvitationViewSet, basename="invitation")
router.register("team-invitations", MembershipInvitationViewSet, basename="team-invitation")

urlpatterns = [
    path("", pages.landing, name="landing"),
    # Browsers ask for /favicon.ico whatever the page links: answer with the SVG rather than a 404.
    path("favicon.ico", pages.favicon),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/", include("webapp.accounts.urls")),
    path("registry/", include("webapp.registry.urls")),
    path("mcp/", include("webapp.mcpservers.urls")),
    path("sweeps/", include("webapp.sweeps.urls")),
    path("alerts/", include("webapp.alerts.urls")),
    path("jobs/", include("webapp.jobs.urls")),
    path("monitor/", include("webapp.jobs.dashboard_urls")),
    path("admin/", admin.site.urls),
    path("api/", include(router.urls)),
    path("api/token/", obtain_token, name="api-token"),
    path("api/jobs/<int:pk>/checkpoints/<int:step>/archive/", job_files.api_checkpoint_archive,
         name="api-checkpoint-archive"),
    path("api/jobs/<int:pk>/checkpoints/<int:step>/export/", job_files.api_checkpoint_export,
         name="api-checkpoint-export"),
    # Any other /api/.../ path is a JSON 404 (not Django's HTML page): API clients always get JSON. Paths
    # without the trailing slash still reach APPEND_SLASH's redirect.
    re_path(r"^api/(?!schema/|docs/).*/$", api_not_found),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The split view serves Swagger UI's start-up script as a file, so the CSP needs no inline script.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
]
