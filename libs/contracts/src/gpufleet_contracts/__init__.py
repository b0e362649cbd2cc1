"""gpufleet contracts: every command and event on the bus, its subject and its wire format."""

from . import subjects
from .base import Command, Envelope, Event, Message, envelope_for
from .errors import ErrorBody, ErrorReply, FieldError, error, field_errors, invalid

__all__ = [
    "Command",
    "Envelope",
    "ErrorBody",
    "ErrorReply",
    "Event",
    "FieldError",
    "Message",
    "envelope_for",
    "error",
    "field_errors",
    "invalid",
    "subjects",
]
