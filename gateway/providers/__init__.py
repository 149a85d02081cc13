"""Providers: where effects go. One module per kind, one small Protocol."""

from gateway.providers.base import (
           Call,
           EmailCall,
           HttpCall,
           Outcome,
           Provider,
           ProviderCall,
           too_late,
)
from gateway.providers.http import HttpProvider
from gateway.providers.smtp import SmtpProvider

__all__ = ["Call", "EmailCall", "HttpCall", "HttpProvider", "Outcome", "Provider",
           "ProviderCall", "SmtpProvider", "too_late"]
