"""A package, so that this directory's conftest is imported as
integration.conftest and does not shadow tests/python/conftest.py (whose
tests do `from conftest import ...`) when pytest runs both directories."""
