"""Tests of the order view, run with ``python manage.py test shop`` on PostgreSQL.

They use ``TransactionTestCase``: the view's ``transaction.atomic()`` then opens a real
transaction (not a savepoint inside the test's), and a second connection can check what
other sessions (a worker) see while it is open.
"""

import threading
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connections
from django.db.models.signals import post_save
from django.test import TransactionTestCase, override_settings
from django.utils import timezone

from django_pgtasks import UnknownQueueError
from django_pgtasks.models import Status, Task

from .models import Customer, Order

ORDER = {"name": "Ada Lovelace", "email": "ada@example.com", "total": "42.50"}


def claim_from_another_connection() -> list[Task]:
    """Claim like a worker does, on a fresh connection in another thread."""
    claimed: list[Task] = []

    def claim() -> None:
        try:
            claimed.extend(Task.objects.claim("test-worker", limit=10))
        finally:
            connections.close_all()

    thread = threading.Thread(target=claim)
    thread.start()
    thread.join()
    return claimed


class PlaceOrderTests(TransactionTestCase):
    def test_form_is_shown(self) -> None:
        response = self.client.get("/")
        self.assertContains(response, "Place an order")

    def test_order_is_stored_with_its_two_tasks(self) -> None:
        response = self.client.post("/", ORDER)

        self.assertRedirects(response, "/")
        order = Order.objects.get()
        assert (order.customer.email, order.total) == ("ada@example.com", Decimal("42.50"))
        day = timezone.localdate(order.created).isoformat()
        tasks = Task.objects.order_by("id").values_list("name", "queue", "args", "status")
        assert list(tasks) == [
            ("shop.tasks.send_order_confirmation", "emails", [order.pk], Status.READY),
            ("shop.tasks.rebuild_daily_report", "reports", [day], Status.READY),
        ]

    def test_returning_customer_is_found_by_email(self) -> None:
        self.client.post("/", ORDER)
        self.client.post("/", {**ORDER, "total": "10.00"})
        assert Customer.objects.count() == 1
        assert Order.objects.count() == 2
        assert Task.objects.count() == 4

    def test_invalid_form_writes_nothing(self) -> None:
        response = self.client.post("/", {**ORDER, "total": "-5"})

        assert response.status_code == 200
        self.assertFormError(
            response.context["form"], "total",
            "Ensure this value is greater than or equal to 0.01.",
        )
        assert not Order.objects.exists()
        assert not Task.objects.exists()

    def test_error_inside_the_transaction_leaves_neither_order_nor_tasks(self) -> None:
        # Without the "reports" queue, the second enqueue raises after the customer, the
        # order and the confirmation task were written: all three must be rolled back.
        queues = [q for q in settings.PGTASKS["QUEUES"] if q != "reports"]
        with (
            override_settings(PGTASKS={**settings.PGTASKS, "QUEUES": queues}),
            self.assertRaisesMessage(UnknownQueueError, "Queue 'reports' is not configured"),
        ):
            self.client.post("/", ORDER)

        assert not Customer.objects.exists()
        assert not Order.objects.exists()
        assert not Task.objects.exists()

    def test_workers_see_the_tasks_only_once_the_order_is_committed(self) -> None:
        seen_before_commit: list[list[Task]] = []

        def on_task_saved(instance: Task, **kwargs: object) -> None:
            # Runs inside the view's transaction, right after each enqueue.
            seen_before_commit.append(claim_from_another_connection())

        post_save.connect(on_task_saved, sender=Task)
        try:
            self.client.post("/", ORDER)
        finally:
            post_save.disconnect(on_task_saved, sender=Task)

        assert seen_before_commit == [[], []]
        claimed = claim_from_another_connection()
        assert sorted(task.name for task in claimed) == [
            "shop.tasks.rebuild_daily_report", "shop.tasks.send_order_confirmation",
        ]


class AdminTests(TransactionTestCase):
    def test_shop_pages_render(self) -> None:
        customer = Customer.objects.create(name="Grace Hopper", email="grace@example.com")
        Order.objects.create(customer=customer, total=Decimal("9.99"))
        self.client.force_login(User.objects.create_superuser("admin", "admin@example.com"))
        for url in ["/admin/shop/customer/", f"/admin/shop/customer/{customer.pk}/change/",
                    "/admin/shop/order/", "/admin/shop/report/", "/admin/shop/notification/"]:
            with self.subTest(url=url):
                assert self.client.get(url).status_code == 200


class FulfilmentPipelineTests(TransactionTestCase):
    def test_the_three_stages_run_once_each_in_order(self) -> None:
        from django_pgtasks.worker.loop import Worker

        from .models import Notification
        from .tasks import pick_order

        customer = Customer.objects.create(name="Grace Hopper", email="grace@example.com")
        order = Order.objects.create(customer=customer, total=Decimal("12.00"))
        Task.objects.enqueue(pick_order, order.pk, stage="pick")
        assert Worker(concurrency=2, burst=True).run(install_signals=False) == 0
        # (The worker's scheduler also runs the periodic refresh_todays_report, stage-less.)
        stages = list(Task.objects.filter(stage__isnull=False).order_by("id")
                      .values_list("stage", "status"))
        assert stages == [("pick", Status.SUCCESSFUL), ("pack", Status.SUCCESSFUL),
                          ("ship", Status.SUCCESSFUL)]
        shipped = Notification.objects.filter(subject=f"Your order #{order.pk} has shipped")
        assert shipped.count() == 1
