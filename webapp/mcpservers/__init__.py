"""MCP servers a team registers: who may register what (``rules``), the entries (``models``), inspection and
"try it" on a worker (``tasks``), the REST API (``api``)."""
