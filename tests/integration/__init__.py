"""Tests on a real PostgreSQL database, in the test process (threads included)."""
