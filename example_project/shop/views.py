from django.contrib import messages
from django.db import transaction
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone

from django_pgtasks.models import Task

from .forms import OrderForm
from .models import Customer, Order, Report
from .tasks import rebuild_daily_report, send_order_confirmation


def place_order(request: HttpRequest) -> HttpResponse:
    """Show the order form (with recent orders, reports and queue state) and take orders."""
    if request.method == "POST":
        form = OrderForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            with transaction.atomic():
                customer, _ = Customer.objects.get_or_create(
                    email=data["email"], defaults={"name": data["name"]}
                )
                order = Order.objects.create(customer=customer, total=data["total"])
                # Enqueued in the order's own transaction: if anything in this block raises,
                # the order and both tasks disappear together, and no worker can claim a task
                # before the order it names has been committed.
                send_order_confirmation.enqueue(order.pk)
                rebuild_daily_report.enqueue(timezone.localdate(order.created).isoformat())
            messages.success(request, f"Order #{order.pk} placed; a confirmation is on its way.")
            # Redirect after POST, so reloading the page does not place the order again.
            return redirect("shop:place_order")
    else:
        form = OrderForm()
    context = {
        "form": form,
        "orders": Order.objects.select_related("customer")[:10],
        "reports": Report.objects.all()[:7],
        "task_counts": Task.objects.values("queue", "status")
        .annotate(count=Count("id"))
        .order_by("queue", "status"),
    }
    return render(request, "shop/place_order.html", context)
