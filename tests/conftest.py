"""Shared pytest setup. Fixture plugins live in tests/fixtures/ and are listed here."""

pytest_plugins: list[str] = ["tests.fixtures.pg"]
