"""A deliberately small shop: customers place orders; tasks confirm them and build reports."""

from decimal import Decimal

from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone


class Customer(models.Model):
    name = models.CharField(max_length=200)
    # Unique so the order form can find a returning customer by email.
    email = models.EmailField(unique=True)

    def __str__(self) -> str:
        return f"{self.name} <{self.email}>"


class Order(models.Model):
    customer = models.ForeignKey(Customer, on_delete=models.CASCADE, related_name="orders")
    total = models.DecimalField(
        max_digits=10, decimal_places=2, validators=[MinValueValidator(Decimal("0.01"))]
    )
    # A default rather than auto_now_add, so the demo can seed orders over past days.
    created = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"Order #{self.pk}"


class Report(models.Model):
    """Orders and revenue of one day, rebuilt by ``shop.tasks.rebuild_daily_report``."""

    day = models.DateField(unique=True)
    order_count = models.PositiveIntegerField(default=0)
    revenue = models.DecimalField(max_digits=12, decimal_places=2, default=Decimal("0"))
    rebuilt_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-day"]

    def __str__(self) -> str:
        return f"Report for {self.day}"


class Notification(models.Model):
    """A message that was sent to a customer (the shop's record of its outgoing mail)."""

    customer = models.ForeignKey(
        Customer, on_delete=models.CASCADE, related_name="notifications"
    )
    subject = models.CharField(max_length=200)
    body = models.TextField()
    sent_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-sent_at"]

    def __str__(self) -> str:
        return self.subject
