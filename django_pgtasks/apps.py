from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class PgTasksConfig(AppConfig):
    name = "django_pgtasks"
    label = "django_pgtasks"
    verbose_name = _("Tasks (PostgreSQL)")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from django_pgtasks import checks  # noqa: F401 - registers the system checks
        from django_pgtasks.conf import pgtasks_settings

        if pgtasks_settings.AUTODISCOVER:
            # Like admin.autodiscover(): import every installed app's tasks.py so that
            # handlers are registered before anything enqueues or runs them by name.
            autodiscover_modules("tasks")
