from django.contrib import admin

from .models import Customer, Notification, Order, Report


class OrderInline(admin.TabularInline):
    model = Order
    extra = 0
    fields = ["total", "created"]


@admin.register(Customer)
class CustomerAdmin(admin.ModelAdmin):
    list_display = ["name", "email"]
    search_fields = ["name", "email"]
    inlines = [OrderInline]


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["id", "customer", "total", "created"]
    list_select_related = ["customer"]
    date_hierarchy = "created"
    search_fields = ["customer__name", "customer__email"]
    raw_id_fields = ["customer"]


@admin.register(Report)
class ReportAdmin(admin.ModelAdmin):
    list_display = ["day", "order_count", "revenue", "rebuilt_at"]
    date_hierarchy = "day"
    # Reports are written by the rebuild_daily_report task only.
    readonly_fields = ["day", "order_count", "revenue", "rebuilt_at"]


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ["subject", "customer", "sent_at"]
    list_select_related = ["customer"]
    search_fields = ["subject", "customer__email"]
    raw_id_fields = ["customer"]
