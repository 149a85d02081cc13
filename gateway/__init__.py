"""The fencegate gateway: fenced, idempotent email and HTTP effects."""
