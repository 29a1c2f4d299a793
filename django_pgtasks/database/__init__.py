"""How django-pgtasks talks to PostgreSQL, beside Django's ORM.

Dedicated sessions (:mod:`.sessions`), whether the schema is migrated (:mod:`.schema`), which
errors are worth trying again (:mod:`.sqlstates`), statements retried when a row moved to
another partition (:mod:`.partition_moves`), the connection budget of the workers
(:mod:`.connection_budget`) and times Python cannot hold (:mod:`.timestamps`). The statements
themselves live in :mod:`django_pgtasks.sql` (the database's functions) and
:mod:`django_pgtasks.lifecycle` (the writes to a task row).
"""
