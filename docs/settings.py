"""Settings used only to import the package while the documentation is built (autodoc).

Nothing connects to this database: it only has to be a PostgreSQL entry for the imports.
"""

SECRET_KEY = "docs-only-not-secret"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_pgtasks",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "pgtasks_docs"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PGTASKS = {"QUEUES": ["default"]}
