"""The REST API (FastAPI): submission, admission, job views, fleet and node endpoints."""
