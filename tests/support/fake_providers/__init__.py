"""Fakes of real providers, on loopback, written from their documentation."""

from .base import FakeProvider, Sent
from .hubspot import FakeHubSpot
from .mailgun import FakeMailgun
from .postmark import FakePostmark
from .resend import FakeResend
from .sendgrid import FakeSendGrid
from .ses import FakeSes

__all__ = ["FakeHubSpot", "FakeMailgun", "FakePostmark", "FakeProvider", "FakeResend",
           "FakeSendGrid", "FakeSes", "Sent"]
