"""The integration suite's real gateway and sinks, for the documents' snippets."""

from tests.integration.conftest import gw, make_gw, smtp_sink, webhook_sink

__all__ = ["gw", "make_gw", "smtp_sink", "webhook_sink"]
