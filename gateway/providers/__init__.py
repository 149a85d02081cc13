"""Providers: where effects go. One module per kind, one small Protocol."""

from .base import Call, EmailCall, HttpCall, Outcome, Provider, ProviderCall, too_late
from .http import HttpProvider
from .smtp import SmtpProvider

__all__ = ["Call", "EmailCall", "HttpCall", "HttpProvider", "Outcome", "Provider",
           "ProviderCall", "SmtpProvider", "too_late"]
