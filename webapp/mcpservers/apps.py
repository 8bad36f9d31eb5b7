from django.apps import AppConfig


class MCPServersConfig(AppConfig):
    name = "webapp.mcpservers"
    label = "mcpservers"
    verbose_name = "MCP servers"
