"""Tests of pure Python: no database, no processes."""
