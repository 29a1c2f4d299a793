"""Base: what a task is and how values cross into the database.

Settings-driven helpers that know no table, no worker and no pattern: the handler registry,
payload and argument validation, queue routing, error texts and their classification,
dedicated database sessions, the connection budget and the registry of maintenance jobs.
"""
