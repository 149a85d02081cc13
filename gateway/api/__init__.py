"""The HTTP API: the route table, authentication, request parsing and
bodies, problem documents, the request and answer schemas, OpenAPI."""
