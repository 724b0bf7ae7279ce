"""The injection pipeline: CPU stages (prepare, run in worker processes), the injector, retries.

Kept empty: injection workers import core.inject.prepare alone, and must not pay for SQLAlchemy."""
