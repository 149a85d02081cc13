"""What only a developer runs: ``fencegate dev`` (an embedded database, local
sinks, a generated key), ``fencegate demo``, and the sinks the tests drive.
Nothing here is imported by the server; aiosmtpd is needed only here."""
