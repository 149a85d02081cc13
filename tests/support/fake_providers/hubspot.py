"""A fake HubSpot CRM (https://developers.hubspot.com/docs/api-reference/error-handling).

``POST /crm/v3/objects/contacts`` with ``Authorization: Bearer <token>``
(else 401 ``INVALID_AUTHENTICATION``); success 201 with the new object.
Answers carry the ``X-HubSpot-RateLimit-*`` headers. HubSpot documents no
idempotency key: every request creates.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .base import FakeProvider, json_answer

PACE = {"X-HubSpot-RateLimit-Interval-Milliseconds": "10000", "X-HubSpot-RateLimit-Max": "100",
        "X-HubSpot-RateLimit-Remaining": "99"}


class FakeHubSpot(FakeProvider):
    secret_env = "FENCEGATE_TEST_HUBSPOT_TOKEN"
    secret = "pat-na1-test"

    def __init__(self) -> None:
        super().__init__()
        #: every contact created: (properties, request headers)
        self.created: list[tuple[dict[str, Any], dict[str, str]]] = []

    def routes(self) -> list[tuple[str, str, Any]]:
        return [("POST", "/crm/v3/objects/contacts", self.create)]

    async def create(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.secret}":
            return json_answer({"status": "error", "message": "Authentication credentials not "
                                "found.", "category": "INVALID_AUTHENTICATION"}, 401, PACE)
        body = json.loads(await request.read())
        properties = body.get("properties")
        if not isinstance(properties, dict):
            return json_answer({"status": "error", "message": "Invalid input JSON",
                                "category": "VALIDATION_ERROR"}, 400, PACE)
        cid = self.new_id("5120{n}")
        scripted = self.script.pop(0) if self.script else None
        if scripted is None or scripted.acted:
            self.created.append((properties, dict(request.headers)))
        if scripted is not None:
            return json_answer(scripted.body, scripted.status, {**PACE, **scripted.headers})
        return json_answer({"id": cid, "properties": properties, "archived": False,
                            "createdAt": "2026-01-01T00:00:00Z"}, 201, PACE)
