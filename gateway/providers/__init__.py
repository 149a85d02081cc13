"""Providers: where effects go. One module per kind, one small Protocol."""

from .base import Outcome, Provider, ProviderCall, too_late
from .http import HttpProvider
from .smtp import SmtpProvider

__all__ = ["HttpProvider", "Outcome", "Provider", "ProviderCall", "SmtpProvider", "too_late"]
